/*
 * hapkcs11.h — the platform macros the OASIS headers ask for (Unix, default
 * packing), then the PKCS#11 v2.40 declarations, then the C helpers the Go
 * side calls. Included by entry.c and by every Go file with a cgo preamble.
 */
#ifndef HAPKCS11_H
#define HAPKCS11_H

#define CK_PTR *
#define CK_DECLARE_FUNCTION(returnType, name) returnType name
#define CK_DECLARE_FUNCTION_POINTER(returnType, name) returnType (*name)
#define CK_CALLBACK_FUNCTION(returnType, name) returnType (*name)
#ifndef NULL_PTR
#define NULL_PTR 0
#endif

#include <stddef.h>
#include <string.h>
#include "pkcs11.h"

/* Returned by hapInitialize (abi.go) to entry.c when the configuration
 * asks for a helper (library.process = "helper"). */
#define HAP_RV_USE_HELPER (CKR_VENDOR_DEFINED | 0x48415048UL)

/* Set in a helper process (conn.c): the engine there serves its parent. */
extern int hap_serving;

/* The static function list (entry.c), for tests of C_GetFunctionList. */
extern CK_FUNCTION_LIST hap_function_list;

#endif
