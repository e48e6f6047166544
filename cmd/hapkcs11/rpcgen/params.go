package main

// Mechanism parameters that hold pointers. The in-process engine hands a
// member the application's parameter as it is, pointers and all; through
// the helper each pointer must cross as the bytes it points at. The
// layouts come from pkcs11t.h, read as it is; which mechanism takes which
// structure is not in the header, so mechParams below says it (PKCS#11
// v2.40 base and current mechanisms). A structure crosses when each of its
// pointers is an input the header lets the generator size: bytes with a
// length field (pX with ulXLen, ulXLength, ulXLenN for pXN, or the next
// field ulLen/length), or one structure that is itself a mechanism's
// parameter (CK_RSA_AES_KEY_WRAP_PARAMS' OAEP parameters), recursively
// through embedded structures. Any other pointer (an output the member
// writes — a PRF's output, a TLS key block, a protocol version — a length
// by pointer, a nested mechanism, a list) makes the structure refused:
// CKR_MECHANISM_PARAM_INVALID in the client, never a pointer sent. The
// same layouts, with their offsets, go to internal/mechparam for hsmserve.

import (
	"bytes"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// mechParams pairs each mechanism whose parameter structure holds a
// pointer with that structure.
var mechParams = map[string]string{
	"CKM_RSA_PKCS_OAEP":                  "CK_RSA_PKCS_OAEP_PARAMS",
	"CKM_RSA_AES_KEY_WRAP":               "CK_RSA_AES_KEY_WRAP_PARAMS",
	"CKM_KEY_WRAP_SET_OAEP":              "CK_KEY_WRAP_SET_OAEP_PARAMS",
	"CKM_ECDH1_DERIVE":                   "CK_ECDH1_DERIVE_PARAMS",
	"CKM_ECDH1_COFACTOR_DERIVE":          "CK_ECDH1_DERIVE_PARAMS",
	"CKM_ECMQV_DERIVE":                   "CK_ECMQV_DERIVE_PARAMS",
	"CKM_ECDH_AES_KEY_WRAP":              "CK_ECDH_AES_KEY_WRAP_PARAMS",
	"CKM_X9_42_DH_DERIVE":                "CK_X9_42_DH1_DERIVE_PARAMS",
	"CKM_X9_42_DH_HYBRID_DERIVE":         "CK_X9_42_DH2_DERIVE_PARAMS",
	"CKM_X9_42_MQV_DERIVE":               "CK_X9_42_MQV_DERIVE_PARAMS",
	"CKM_KEA_KEY_DERIVE":                 "CK_KEA_DERIVE_PARAMS",
	"CKM_KEA_DERIVE":                     "CK_KEA_DERIVE_PARAMS",
	"CKM_GOSTR3410_DERIVE":               "CK_GOSTR3410_DERIVE_PARAMS",
	"CKM_GOSTR3410_KEY_WRAP":             "CK_GOSTR3410_KEY_WRAP_PARAMS",
	"CKM_DSA_PROBABLISTIC_PARAMETER_GEN": "CK_DSA_PARAMETER_GEN_PARAM",
	"CKM_DSA_SHAWE_TAYLOR_PARAMETER_GEN": "CK_DSA_PARAMETER_GEN_PARAM",
	"CKM_AES_GCM":                        "CK_GCM_PARAMS",
	"CKM_AES_CCM":                        "CK_CCM_PARAMS",
	"CKM_RC5_CBC":                        "CK_RC5_CBC_PARAMS",
	"CKM_RC5_CBC_PAD":                    "CK_RC5_CBC_PARAMS",
	// Derivation by data.
	"CKM_CONCATENATE_BASE_AND_DATA": "CK_KEY_DERIVATION_STRING_DATA",
	"CKM_CONCATENATE_DATA_AND_BASE": "CK_KEY_DERIVATION_STRING_DATA",
	"CKM_XOR_BASE_AND_DATA":         "CK_KEY_DERIVATION_STRING_DATA",
	"CKM_DES_ECB_ENCRYPT_DATA":      "CK_KEY_DERIVATION_STRING_DATA",
	"CKM_DES3_ECB_ENCRYPT_DATA":     "CK_KEY_DERIVATION_STRING_DATA",
	"CKM_AES_ECB_ENCRYPT_DATA":      "CK_KEY_DERIVATION_STRING_DATA",
	"CKM_CAMELLIA_ECB_ENCRYPT_DATA": "CK_KEY_DERIVATION_STRING_DATA",
	"CKM_ARIA_ECB_ENCRYPT_DATA":     "CK_KEY_DERIVATION_STRING_DATA",
	"CKM_SEED_ECB_ENCRYPT_DATA":     "CK_KEY_DERIVATION_STRING_DATA",
	"CKM_DES_CBC_ENCRYPT_DATA":      "CK_DES_CBC_ENCRYPT_DATA_PARAMS",
	"CKM_DES3_CBC_ENCRYPT_DATA":     "CK_DES_CBC_ENCRYPT_DATA_PARAMS",
	"CKM_AES_CBC_ENCRYPT_DATA":      "CK_AES_CBC_ENCRYPT_DATA_PARAMS",
	"CKM_CAMELLIA_CBC_ENCRYPT_DATA": "CK_CAMELLIA_CBC_ENCRYPT_DATA_PARAMS",
	"CKM_ARIA_CBC_ENCRYPT_DATA":     "CK_ARIA_CBC_ENCRYPT_DATA_PARAMS",
	"CKM_SEED_CBC_ENCRYPT_DATA":     "CK_SEED_CBC_ENCRYPT_DATA_PARAMS",
	// Password-based (v2.40's PBKD2 layout: the password's length by value).
	"CKM_PKCS5_PBKD2":             "CK_PKCS5_PBKD2_PARAMS2",
	"CKM_PBE_MD2_DES_CBC":         "CK_PBE_PARAMS",
	"CKM_PBE_MD5_DES_CBC":         "CK_PBE_PARAMS",
	"CKM_PBE_MD5_CAST_CBC":        "CK_PBE_PARAMS",
	"CKM_PBE_MD5_CAST3_CBC":       "CK_PBE_PARAMS",
	"CKM_PBE_MD5_CAST128_CBC":     "CK_PBE_PARAMS",
	"CKM_PBE_SHA1_CAST128_CBC":    "CK_PBE_PARAMS",
	"CKM_PBE_SHA1_RC4_128":        "CK_PBE_PARAMS",
	"CKM_PBE_SHA1_RC4_40":         "CK_PBE_PARAMS",
	"CKM_PBE_SHA1_DES3_EDE_CBC":   "CK_PBE_PARAMS",
	"CKM_PBE_SHA1_DES2_EDE_CBC":   "CK_PBE_PARAMS",
	"CKM_PBE_SHA1_RC2_128_CBC":    "CK_PBE_PARAMS",
	"CKM_PBE_SHA1_RC2_40_CBC":     "CK_PBE_PARAMS",
	"CKM_PBA_SHA1_WITH_SHA1_HMAC": "CK_PBE_PARAMS",
	"CKM_SKIPJACK_PRIVATE_WRAP":   "CK_SKIPJACK_PRIVATE_WRAP_PARAMS",
	"CKM_SKIPJACK_RELAYX":         "CK_SKIPJACK_RELAYX_PARAMS",
	// SSL, TLS and WTLS.
	"CKM_SSL3_MASTER_KEY_DERIVE":         "CK_SSL3_MASTER_KEY_DERIVE_PARAMS",
	"CKM_SSL3_MASTER_KEY_DERIVE_DH":      "CK_SSL3_MASTER_KEY_DERIVE_PARAMS",
	"CKM_TLS_MASTER_KEY_DERIVE":          "CK_SSL3_MASTER_KEY_DERIVE_PARAMS",
	"CKM_TLS_MASTER_KEY_DERIVE_DH":       "CK_SSL3_MASTER_KEY_DERIVE_PARAMS",
	"CKM_SSL3_KEY_AND_MAC_DERIVE":        "CK_SSL3_KEY_MAT_PARAMS",
	"CKM_TLS_KEY_AND_MAC_DERIVE":         "CK_SSL3_KEY_MAT_PARAMS",
	"CKM_TLS_PRF":                        "CK_TLS_PRF_PARAMS",
	"CKM_TLS12_MASTER_KEY_DERIVE":        "CK_TLS12_MASTER_KEY_DERIVE_PARAMS",
	"CKM_TLS12_MASTER_KEY_DERIVE_DH":     "CK_TLS12_MASTER_KEY_DERIVE_PARAMS",
	"CKM_TLS12_KEY_AND_MAC_DERIVE":       "CK_TLS12_KEY_MAT_PARAMS",
	"CKM_TLS12_KEY_SAFE_DERIVE":          "CK_TLS12_KEY_MAT_PARAMS",
	"CKM_TLS12_KDF":                      "CK_TLS_KDF_PARAMS",
	"CKM_TLS_KDF":                        "CK_TLS_KDF_PARAMS",
	"CKM_WTLS_MASTER_KEY_DERIVE":         "CK_WTLS_MASTER_KEY_DERIVE_PARAMS",
	"CKM_WTLS_MASTER_KEY_DERIVE_DH_ECC":  "CK_WTLS_MASTER_KEY_DERIVE_PARAMS",
	"CKM_WTLS_PRF":                       "CK_WTLS_PRF_PARAMS",
	"CKM_WTLS_SERVER_KEY_AND_MAC_DERIVE": "CK_WTLS_KEY_MAT_PARAMS",
	"CKM_WTLS_CLIENT_KEY_AND_MAC_DERIVE": "CK_WTLS_KEY_MAT_PARAMS",
	// Others.
	"CKM_CMS_SIG":    "CK_CMS_SIG_PARAMS",
	"CKM_KIP_DERIVE": "CK_KIP_PARAMS",
	"CKM_KIP_WRAP":   "CK_KIP_PARAMS",
	"CKM_KIP_MAC":    "CK_KIP_PARAMS",
	"CKM_SECURID":    "CK_OTP_PARAMS",
	"CKM_HOTP":       "CK_OTP_PARAMS",
	"CKM_ACTI":       "CK_OTP_PARAMS",
}

// notParams are the structures of pkcs11t.h with pointers that no
// mechanism takes as its parameter: the generator stops at any other
// structure with a pointer that mechParams does not name, so a new one in
// the header is a decision, not a pointer sent.
var notParams = map[string]string{
	"CK_ATTRIBUTE":           "a template entry",
	"CK_MECHANISM":           "the mechanism itself",
	"CK_FUNCTION_LIST":       "the function list",
	"CK_C_INITIALIZE_ARGS":   "C_Initialize's argument",
	"CK_SSL3_RANDOM_DATA":    "embedded in the SSL and TLS parameters",
	"CK_SSL3_KEY_MAT_OUT":    "an output inside CK_SSL3_KEY_MAT_PARAMS",
	"CK_WTLS_RANDOM_DATA":    "embedded in the WTLS parameters",
	"CK_WTLS_KEY_MAT_OUT":    "an output inside CK_WTLS_KEY_MAT_PARAMS",
	"CK_OTP_PARAM":           "an entry of CK_OTP_PARAMS",
	"CK_OTP_SIGNATURE_INFO":  "an OTP signature's output",
	"CK_AES_GCM_PARAMS":      "deprecated name of CK_GCM_PARAMS (same layout)",
	"CK_AES_CCM_PARAMS":      "deprecated name of CK_CCM_PARAMS (same layout)",
	"CK_ECDH2_DERIVE_PARAMS": "v2.20's ECMQV layout; v2.40 takes CK_ECMQV_DERIVE_PARAMS",
	"CK_PKCS5_PBKD2_PARAMS":  "v2.20's PBKD2 layout (the length by pointer); v2.40 takes CK_PKCS5_PBKD2_PARAMS2",
}

// field is one member of a structure: n elements of typ (an array when
// n > 1).
type field struct {
	typ, name string
	n         int
}

// types is what the generator reads of pkcs11t.h.
type types struct {
	structs map[string][]field
	ptrTo   map[string]string // pointer typedef: the type it points at
	alias   map[string]string // other typedefs: the type they rename
	mechs   map[string]uint64 // CKM_ names and their values
}

var (
	structDecl = regexp.MustCompile(`(?s)typedef\s+struct\s+(\w+)\s*\{(.*?)\}\s*(\w+)\s*;`)
	ptrDecl    = regexp.MustCompile(`typedef\s+(?:struct\s+)?(\w+)\s+CK_PTR\s+(\w+)\s*;`)
	aliasDecl  = regexp.MustCompile(`typedef\s+(\w+)\s+(\w+)\s*;`)
	mechDecl   = regexp.MustCompile(`(?m)^#define\s+(CKM_\w+)\s+(\w+)`)
	fieldDecl  = regexp.MustCompile(`^(\w+)\s+(\w+)(?:\s*\[\s*(\w+)\s*\])?$`)
)

func parseTypes(src []byte) (*types, error) {
	text := strings.ReplaceAll(string(comment.ReplaceAll(src, nil)), "\\\n", " ")
	h := &types{structs: map[string][]field{}, ptrTo: map[string]string{}, alias: map[string]string{}, mechs: map[string]uint64{}}
	for _, m := range structDecl.FindAllStringSubmatch(text, -1) {
		var fs []field
		for _, d := range strings.Split(m[2], ";") {
			d = strings.Join(strings.Fields(d), " ")
			if d == "" {
				continue
			}
			f := fieldDecl.FindStringSubmatch(d)
			if f == nil {
				// Function pointers (CK_FUNCTION_LIST) and the like: a
				// structure no parameter is.
				f = []string{d, "?", d, ""}
			}
			n := 1
			if f[3] != "" {
				if _, err := fmt.Sscan(f[3], &n); err != nil {
					n = -1 // an array whose size the generator cannot read
				}
			}
			fs = append(fs, field{f[1], f[2], n})
		}
		h.structs[m[3]] = fs
	}
	for _, m := range ptrDecl.FindAllStringSubmatch(text, -1) {
		h.ptrTo[m[2]] = m[1]
	}
	for _, m := range aliasDecl.FindAllStringSubmatch(text, -1) {
		if m[1] != "struct" {
			h.alias[m[2]] = m[1]
		}
	}
	aliases := map[string]string{}
	for _, m := range mechDecl.FindAllStringSubmatch(text, -1) {
		var v uint64
		if _, err := fmt.Sscanf(strings.TrimRight(m[2], "UL"), "0x%x", &v); err == nil {
			h.mechs[m[1]] = v
		} else {
			aliases[m[1]] = m[2] // another CKM_ name
		}
	}
	for name, to := range aliases {
		if v, ok := h.mechs[to]; ok {
			h.mechs[name] = v
		}
	}
	if len(h.structs) < 60 || len(h.mechs) < 300 {
		return nil, fmt.Errorf("pkcs11t.h: found %d structures and %d mechanisms, v2.40 has more", len(h.structs), len(h.mechs))
	}
	return h, nil
}

// ptr is a pointer of a parameter structure: bytes with a length field, or
// one structure.
type ptr struct {
	path, length string // C member designators (a.b for an embedded a)
	to           string // the structure pointed at, or "" for bytes
}

// layout is how a parameter structure crosses: its pointers in order, or
// why it cannot.
type layout struct {
	ptrs    []ptr
	refused string
}

var byteTargets = map[string]bool{"CK_BYTE": true, "CK_CHAR": true, "CK_UTF8CHAR": true, "void": true}

// lengthOf finds the length field of the byte pointer fs[i].
func lengthOf(fs []field, i int) string {
	x := strings.TrimPrefix(fs[i].name, "p")
	want := map[string]bool{"ul" + x + "Len": true, "ul" + x + "Length": true}
	if base := strings.TrimRight(x, "0123456789"); base != x {
		want["ul"+base+"Len"+x[len(base):]] = true
	}
	for _, f := range fs {
		if want[f.name] && f.typ == "CK_ULONG" {
			return f.name
		}
	}
	if i+1 < len(fs) && fs[i+1].typ == "CK_ULONG" && (fs[i+1].name == "ulLen" || fs[i+1].name == "length") {
		return fs[i+1].name
	}
	return ""
}

// layoutOf classifies structure s; params are the structures a mechanism
// takes (the only ones a pointer may lead to as an input).
func (h *types) layoutOf(s string, params map[string]bool, prefix string) layout {
	fs, ok := h.structs[s]
	if !ok {
		return layout{refused: s + " is not a structure of pkcs11t.h"}
	}
	var l layout
	for i, f := range fs {
		at := prefix + f.name
		if to, isPtr := h.ptrTo[f.typ]; isPtr {
			switch {
			case byteTargets[to]:
				n := lengthOf(fs, i)
				if n == "" {
					return layout{refused: fmt.Sprintf("%s has no length field", at)}
				}
				l.ptrs = append(l.ptrs, ptr{path: at, length: prefix + n})
			case params[to]:
				if sub := h.layoutOf(to, params, ""); sub.refused != "" {
					return layout{refused: fmt.Sprintf("%s points at %s: %s", at, to, sub.refused)}
				}
				l.ptrs = append(l.ptrs, ptr{path: at, to: to})
			default:
				return layout{refused: fmt.Sprintf("%s points at a %s, not bytes or a parameter structure", at, to)}
			}
			continue
		}
		if _, embedded := h.structs[f.typ]; embedded {
			sub := h.layoutOf(f.typ, params, at+".")
			if sub.refused != "" {
				return sub
			}
			l.ptrs = append(l.ptrs, sub.ptrs...)
		}
	}
	return l
}

// hasPointer reports whether structure s holds a pointer, itself or in a
// structure it embeds.
func (h *types) hasPointer(s string) bool {
	for _, f := range h.structs[s] {
		if _, isPtr := h.ptrTo[f.typ]; isPtr || f.typ == "?" {
			return true
		}
		if _, embedded := h.structs[f.typ]; embedded && h.hasPointer(f.typ) {
			return true
		}
	}
	return false
}

// word is the size and alignment of a CK_ULONG and of a pointer in the
// layouts written for Go (LP64: Linux on amd64 and arm64). rpc_params.c
// asserts every offset and size written for Go against the C compiler's,
// so a build where they differ stops there.
const word = 8

// sizeOf returns the size and alignment of type t.
func (h *types) sizeOf(t string) (size, align int, err error) {
	for {
		if _, isPtr := h.ptrTo[t]; isPtr {
			return word, word, nil
		}
		a, ok := h.alias[t]
		if !ok {
			break
		}
		t = a
	}
	switch t {
	case "CK_BYTE":
		return 1, 1, nil
	case "CK_ULONG", "CK_LONG":
		return word, word, nil
	}
	if _, ok := h.structs[t]; ok {
		_, size, align, err := h.place(t, "", 0)
		return size, align, err
	}
	return 0, 0, fmt.Errorf("no size known for type %s", t)
}

// placed is a member of a structure at its offset; the members of an
// embedded structure are placed one by one (path a.b).
type placed struct {
	path, typ string
	off       int
}

// place lays structure s out as a C compiler does: each member at the next
// multiple of its alignment, the size a multiple of the largest.
func (h *types) place(s, prefix string, base int) (fs []placed, size, align int, err error) {
	align = 1
	for _, f := range h.structs[s] {
		if f.n < 0 || f.typ == "?" {
			return nil, 0, 0, fmt.Errorf("%s: cannot lay out member %s", s, f.name)
		}
		sz, al, err := h.sizeOf(f.typ)
		if err != nil {
			return nil, 0, 0, fmt.Errorf("%s.%s: %w", s, f.name, err)
		}
		size = (size + al - 1) / al * al
		_, isPtr := h.ptrTo[f.typ]
		if _, embedded := h.structs[f.typ]; embedded && !isPtr {
			sub, _, _, _ := h.place(f.typ, prefix+f.name+".", base+size)
			fs = append(fs, sub...)
		} else {
			fs = append(fs, placed{prefix + f.name, f.typ, base + size})
		}
		size += sz * f.n
		align = max(align, al)
	}
	return fs, (size + align - 1) / align * align, align, nil
}

// paramCode writes rpc_params.c (each parameter structure's pointers and the
// mechanisms that take it) and its Go twin for pkg/remote,
// internal/mechparam's layouts_gen.go.
func paramCode(h *types) (cCode, goCode []byte, err error) {
	taken := map[string]bool{}
	for m, s := range mechParams {
		if _, ok := h.mechs[m]; !ok {
			return nil, nil, fmt.Errorf("mechParams: %s is not in pkcs11t.h", m)
		}
		if _, ok := h.structs[s]; !ok {
			return nil, nil, fmt.Errorf("mechParams: %s (of %s) is not a structure of pkcs11t.h", s, m)
		}
		if !h.hasPointer(s) {
			return nil, nil, fmt.Errorf("mechParams: %s (of %s) holds no pointer: it crosses as its bytes, leave it out", s, m)
		}
		taken[s] = true
	}
	names := slices.Sorted(maps.Keys(h.structs))
	for _, s := range names {
		if h.hasPointer(s) && !taken[s] && notParams[s] == "" {
			return nil, nil, fmt.Errorf("pkcs11t.h: %s holds a pointer and is neither a mechanism's parameter (mechParams) nor listed in notParams", s)
		}
	}

	var b bytes.Buffer
	b.WriteString("/* Code generated by rpcgen from pkcs11t.h; DO NOT EDIT. */\n\n")
	b.WriteString(`/*
 * rpc_params.c — the mechanism parameters that hold pointers, as they
 * cross to the helper: each structure's size and its pointers (bytes with
 * their length field, or one structure), and which mechanism takes which
 * (rpcgen/params.go, from pkcs11t.h). rpc.c walks them, both sides.
 */
#include "hapkcs11.h"
#include "rpc.h"

const struct hap_param hap_param_refused = {0, 0, NULL};
`)
	var g bytes.Buffer
	g.WriteString(`// Code generated by rpcgen from pkcs11t.h; DO NOT EDIT.

package mechparam

// The mechanism parameters that hold pointers, as rpc_params.c in
// cmd/hapkcs11 has them (rpcgen/params.go), with the offsets of an LP64
// build: rpc_params.c asserts each against the C compiler's.
`)
	layouts := map[string]layout{}
	var emit func(s string) error
	emit = func(s string) error {
		if _, done := layouts[s]; done {
			return nil
		}
		l := h.layoutOf(s, taken, "")
		layouts[s] = l
		if l.refused != "" {
			fmt.Fprintf(&b, "\n/* %s: refused, %s. */\n", s, l.refused)
			fmt.Fprintf(&g, "\nvar layout%s = &Layout{Name: %[1]q, Refused: %q}\n", s, l.refused)
			return nil
		}
		for _, p := range l.ptrs {
			if p.to != "" {
				if err := emit(p.to); err != nil { // the target's descriptor first
					return err
				}
			}
		}
		fmt.Fprintf(&b, "\nstatic const struct hap_ptr hap_ptrs_%s[] = {\n", s)
		for _, p := range l.ptrs {
			if p.to != "" {
				fmt.Fprintf(&b, "\t{offsetof(%s, %s), 0, &hap_param_%s},\n", s, p.path, p.to)
			} else {
				fmt.Fprintf(&b, "\t{offsetof(%[1]s, %[2]s), offsetof(%[1]s, %[3]s), NULL},\n", s, p.path, p.length)
			}
		}
		fmt.Fprintf(&b, "};\nstatic const struct hap_param hap_param_%s = {sizeof(%[1]s), %d, hap_ptrs_%[1]s};\n", s, len(l.ptrs))
		return goLayout(&b, &g, h, s, l)
	}
	structs := slices.Sorted(maps.Keys(taken))
	for _, s := range structs {
		if err := emit(s); err != nil {
			return nil, nil, err
		}
	}
	bySt := map[string][]string{}
	for m, st := range mechParams {
		bySt[st] = append(bySt[st], m)
	}
	b.WriteString("\nconst struct hap_param *hap_mech_param(CK_MECHANISM_TYPE t)\n{\n\tswitch (t) {\n")
	for _, st := range structs {
		ms := bySt[st]
		sort.Strings(ms)
		for _, m := range ms {
			fmt.Fprintf(&b, "\tcase %s:\n", m)
		}
		if layouts[st].refused != "" {
			b.WriteString("\t\treturn &hap_param_refused;\n")
		} else {
			fmt.Fprintf(&b, "\t\treturn &hap_param_%s;\n", st)
		}
	}
	b.WriteString("\t}\n\treturn NULL;\n}\n")

	type entry struct {
		value uint64
		name  string
	}
	var entries []entry
	seen := map[uint64]string{}
	for m, st := range mechParams {
		v := h.mechs[m]
		if other, dup := seen[v]; dup && mechParams[other] != st {
			return nil, nil, fmt.Errorf("mechParams: %s and %s are both 0x%x and take different structures", m, other, v)
		} else if dup {
			continue
		}
		seen[v] = m
		entries = append(entries, entry{v, m})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].value < entries[j].value })
	g.WriteString("\n// byMech pairs each mechanism with its parameter's layout.\nvar byMech = map[uint]*Layout{\n")
	for _, e := range entries {
		fmt.Fprintf(&g, "\t0x%08x: layout%s, // %s\n", e.value, mechParams[e.name], e.name)
	}
	g.WriteString("}\n")
	return b.Bytes(), g.Bytes(), nil
}

// goLayout writes structure s's layout l for Go, and asserts in C its size
// and each offset it writes (a length field is a word).
func goLayout(b, g *bytes.Buffer, h *types, s string, l layout) error {
	fs, size, _, err := h.place(s, "", 0)
	if err != nil {
		return err
	}
	at := map[string]int{}
	for _, f := range fs {
		at[f.path] = f.off
	}
	assert := func(member string, off int) {
		fmt.Fprintf(b, "_Static_assert(offsetof(%s, %s) == %d, \"internal/mechparam: %[1]s.%[2]s\");\n", s, member, off)
	}
	fmt.Fprintf(b, "_Static_assert(sizeof(%s) == %d, \"internal/mechparam: %[1]s\");\n", s, size)
	fmt.Fprintf(g, "\nvar layout%s = &Layout{Name: %[1]q, Size: %d, Ptrs: []Ptr{\n", s, size)
	for _, p := range l.ptrs {
		assert(p.path, at[p.path])
		if p.to != "" {
			fmt.Fprintf(g, "\t{Name: %q, At: %d, To: layout%s},\n", p.path, at[p.path], p.to)
			continue
		}
		fmt.Fprintf(g, "\t{Name: %q, At: %d, Len: %d},\n", p.path, at[p.path], at[p.length])
	}
	g.WriteString("}, Words: map[string]int{")
	var words []string
	for _, f := range fs {
		if _, isPtr := h.ptrTo[f.typ]; isPtr {
			continue
		}
		if sz, _, err := h.sizeOf(f.typ); err == nil && sz == word {
			assert(f.path, f.off)
			words = append(words, fmt.Sprintf("%q: %d", f.path, f.off))
		}
	}
	g.WriteString(strings.Join(words, ", "))
	g.WriteString("}}\n")
	return nil
}
