package p11raw

/*
#include <stdlib.h>

typedef unsigned long hga_ulong;

typedef struct {
	hga_ulong type;
	void *pValue;
	hga_ulong ulValueLen;
} hga_attr;

typedef hga_ulong (*hga_get_fn)(hga_ulong, hga_ulong, hga_attr *, hga_ulong);

// The function list: a CK_VERSION (two bytes, padded to a pointer), then
// one pointer per function; C_GetAttributeValue is the 25th.
typedef struct {
	unsigned char major, minor;
	void *fn[25];
} hga_function_list;

// hga_get_once reads n attributes of obj in one C_GetAttributeValue, each
// into its own slot of each bytes in buf; lens gets each value's length.
static hga_ulong hga_get_once(void *fl, hga_ulong session, hga_ulong obj, const hga_ulong *types, hga_ulong n,
                              unsigned char *buf, hga_ulong each, hga_ulong *lens) {
	hga_attr *t = calloc(n, sizeof(hga_attr));
	if (t == NULL) {
		return 0x02; // CKR_HOST_MEMORY
	}
	for (hga_ulong i = 0; i < n; i++) {
		t[i].type = types[i];
		t[i].pValue = buf + i * each;
		t[i].ulValueLen = each;
	}
	hga_get_fn f = (hga_get_fn)((hga_function_list *)fl)->fn[24];
	hga_ulong rv = f(session, obj, t, n);
	for (hga_ulong i = 0; i < n; i++) {
		lens[i] = t[i].ulValueLen;
	}
	free(t);
	return rv;
}
*/
import "C"

import (
	"unsafe"

	"github.com/miekg/pkcs11"
)

// AttrRoom is the room GetAttributes gives each value: identities, flags,
// check values, EC points and RSA moduli up to 4096 bits fit; a longer
// value (a certificate) answers CKR_BUFFER_TOO_SMALL, and the caller asks
// its length first.
const AttrRoom = 512

// GetAttributes reads types of object h in one C_GetAttributeValue, each
// value given AttrRoom bytes, where miekg/pkcs11 makes two calls (lengths,
// then values). It returns the module's answer: on CKR_OK every value;
// otherwise (a sensitive or unknown attribute, a value that does not fit,
// a call that failed) no values and the code, for the caller to read the
// attributes its own way.
func GetAttributes(fl unsafe.Pointer, sh pkcs11.SessionHandle, h pkcs11.ObjectHandle, types []uint) ([][]byte, uint) {
	n := len(types)
	if n == 0 {
		return nil, 0
	}
	ts := make([]C.hga_ulong, n)
	for i, t := range types {
		if t&pkcs11.CKF_ARRAY_ATTRIBUTE != 0 {
			// Its value is an array of CK_ATTRIBUTE: a module reads the
			// room given as such an array (templates of its own), so
			// it is read its own way.
			return nil, pkcs11.CKR_BUFFER_TOO_SMALL
		}
		ts[i] = C.hga_ulong(t)
	}
	lens := make([]C.hga_ulong, n)
	buf := make([]byte, n*AttrRoom)
	rv := C.hga_get_once(fl, C.hga_ulong(sh), C.hga_ulong(h), &ts[0], C.hga_ulong(n),
		(*C.uchar)(unsafe.Pointer(&buf[0])), AttrRoom, &lens[0])
	if rv != 0 {
		return nil, uint(rv)
	}
	out := make([][]byte, n)
	for i, l := range lens {
		if l > AttrRoom {
			return nil, pkcs11.CKR_BUFFER_TOO_SMALL // a length that cannot be: read it the long way
		}
		out[i] = append([]byte{}, buf[i*AttrRoom:i*AttrRoom+int(l)]...) // empty, not nil, as miekg reads it
	}
	return out, 0
}
