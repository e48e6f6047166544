// Package p11raw holds the PKCS#11 calls made straight to a module's
// CK_FUNCTION_LIST (read from a miekg context) rather than through
// miekg/pkcs11: attributes whose value is itself an attribute array
// (CKA_WRAP_TEMPLATE, CKA_UNWRAP_TEMPLATE, CKA_DERIVE_TEMPLATE), which
// miekg cannot express; and an operation's Init with its single-part call
// in one crossing of cgo (Shot), the hot path of every signature. It is
// shared by pkg/slot (in-process members) and pkg/remote (the token server).
//
// Only the parts of the PKCS#11 ABI used here are declared, so the build
// needs no PKCS#11 development headers: CK_ATTRIBUTE, CK_MECHANISM, and the
// function list up to C_Verify (its members are, in order, CK_VERSION and
// one function pointer per C_ function as listed in pkcs11f.h).
package p11raw

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long hg_ulong;

typedef struct {
	hg_ulong type;
	void *pValue;
	hg_ulong ulValueLen;
} hg_attr;

typedef struct {
	unsigned char major;
	unsigned char minor;
} hg_version;

enum {
	HG_FN_GET_FUNCTION_LIST = 3,
	HG_FN_CREATE_OBJECT = 20,
	HG_FN_GET_ATTRIBUTE_VALUE = 24,
	HG_FN_ENCRYPT_INIT = 29, // each Init is followed by its single-part call
	HG_FN_DECRYPT_INIT = 33,
	HG_FN_DIGEST_INIT = 37,
	HG_FN_SIGN_INIT = 42,
	HG_FN_VERIFY_INIT = 48,
	HG_FN_COUNT = 50
};

typedef struct {
	hg_version version;
	void *fn[HG_FN_COUNT];
} hg_function_list;

typedef hg_ulong (*hg_create_object)(hg_ulong, hg_attr *, hg_ulong, hg_ulong *);
typedef hg_ulong (*hg_get_attribute_value)(hg_ulong, hg_ulong, hg_attr *, hg_ulong);

// The layout of miekg/pkcs11 v1.1.2's struct ctx (the C side of pkcs11.Ctx).
typedef struct {
	void *handle;
	void *sym;
} hg_miekg_ctx;

// hg_function_list_of returns the function list behind a miekg context after
// checking that the context's library handle is the one dlopen gives for
// path. Returns 0 on success, 1 when the module is not loaded, 2 on a
// handle mismatch, 3 on an implausible function list.
static int hg_function_list_of(void *miekg, const char *path, void **out) {
	hg_miekg_ctx *c = (hg_miekg_ctx *)miekg;
	void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
	if (h == NULL) {
		return 1;
	}
	dlclose(h);
	if (c->handle != h) {
		return 2;
	}
	hg_function_list *fl = (hg_function_list *)c->sym;
	if (fl == NULL || fl->version.major < 2 || fl->version.major > 3 ||
	    fl->fn[HG_FN_CREATE_OBJECT] == NULL || fl->fn[HG_FN_GET_ATTRIBUTE_VALUE] == NULL) {
		return 3;
	}
	*out = fl;
	return 0;
}

// hg_symbol returns the address of an exported symbol of an already loaded
// library (for tests that check the function list layout).
static void *hg_symbol(const char *path, const char *name) {
	void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
	if (h == NULL) {
		return NULL;
	}
	void *s = dlsym(h, name);
	dlclose(h);
	return s;
}

static void *hg_fn(void *fl, int i) {
	return ((hg_function_list *)fl)->fn[i];
}

static hg_ulong hg_create(void *fl, hg_ulong session, hg_attr *tmpl, hg_ulong n, hg_ulong *obj) {
	hg_create_object f = (hg_create_object)((hg_function_list *)fl)->fn[HG_FN_CREATE_OBJECT];
	return f(session, tmpl, n, obj);
}

typedef struct {
	hg_ulong mechanism;
	void *pParameter;
	hg_ulong ulParameterLen;
} hg_mech;

typedef hg_ulong (*hg_init_fn)(hg_ulong, hg_mech *, hg_ulong);
typedef hg_ulong (*hg_digest_init_fn)(hg_ulong, hg_mech *);
typedef hg_ulong (*hg_single_fn)(hg_ulong, void *, hg_ulong, void *, hg_ulong *);
typedef hg_ulong (*hg_verify_fn)(hg_ulong, void *, hg_ulong, void *, hg_ulong);

// hg_single makes the single-part call of the operation whose Init is
// fn[init] (C_Sign … C_Verify): in, then out (*outlen bytes; C_Verify's
// signature).
static hg_ulong hg_single(void *fl, int init, hg_ulong session, void *in, hg_ulong inlen, void *out, hg_ulong *outlen) {
	void *f = ((hg_function_list *)fl)->fn[init + 1];
	if (f == NULL) {
		return 0x54; // CKR_FUNCTION_NOT_SUPPORTED
	}
	if (init == HG_FN_VERIFY_INIT) {
		return ((hg_verify_fn)f)(session, in, inlen, out, *outlen);
	}
	return ((hg_single_fn)f)(session, in, inlen, out, outlen);
}

// hg_rv_len is a call's return value and the output length it left.
typedef struct {
	hg_ulong rv;
	hg_ulong len;
} hg_rv_len;

// hg_one_shot calls fn[init] (C_SignInit …) and then, when it succeeds,
// the single-part call: one crossing into C for the two. The output
// length goes in and comes back by value, so no Go pointer to it crosses
// (one heap allocation and one cgo pointer check fewer per signature).
static hg_rv_len hg_one_shot(void *fl, int init, hg_ulong session, hg_ulong mech, void *param, hg_ulong plen,
                            hg_ulong key, void *in, hg_ulong inlen, void *out, hg_ulong outlen) {
	hg_rv_len r = { 0x54, outlen };
	void *f = ((hg_function_list *)fl)->fn[init];
	if (f == NULL) {
		return r;
	}
	hg_mech m = { mech, param, plen };
	r.rv = init == HG_FN_DIGEST_INIT ? ((hg_digest_init_fn)f)(session, &m) : ((hg_init_fn)f)(session, &m, key);
	if (r.rv != 0) {
		return r;
	}
	r.rv = hg_single(fl, init, session, in, inlen, out, &r.len);
	return r;
}

// hg_shot is a one-shot call in C memory, made by hg_shot_run on a worker
// that may still make it after its caller gave up (so nothing in it is Go
// memory). buf holds the mechanism parameter, the input and the output (or
// Verify's signature) one after another; big is the output the module asked
// for after CKR_BUFFER_TOO_SMALL.
typedef struct {
	void *fl;
	int kind;
	hg_ulong session, mech, plen, key, inlen, outcap;
	hg_ulong rv, outlen;
	unsigned char *buf, *big;
	hg_ulong cap, bigcap;
} hg_shot;

static void hg_shot_run(void *p) {
	hg_shot *s = p;
	unsigned char *param = s->buf, *in = param + s->plen, *out = in + s->inlen;
	hg_rv_len r = hg_one_shot(s->fl, s->kind, s->session, s->mech, s->plen ? param : NULL, s->plen,
	                          s->key, in, s->inlen, out, s->outcap);
	s->rv = r.rv;
	s->outlen = r.len;
	s->bigcap = 0;
	if (r.rv != 0x150 || s->kind == HG_FN_VERIFY_INIT) { // CKR_BUFFER_TOO_SMALL
		return;
	}
	hg_ulong n = r.len;
	if (n <= s->outcap && (s->rv = hg_single(s->fl, s->kind, s->session, in, s->inlen, NULL, &n)) != 0) {
		if (s->rv != 0x91) { // CKR_OPERATION_NOT_INITIALIZED: see below
			return;
		}
		n = s->outcap < 512 ? 512 : 2 * s->outcap;
	}
	free(s->big);
	if ((s->big = malloc(n ? n : 1)) == NULL) {
		s->rv = 0x02; // CKR_HOST_MEMORY
		return;
	}
	s->bigcap = n ? n : 1;
	s->outlen = s->bigcap;
	s->rv = hg_single(s->fl, s->kind, s->session, in, s->inlen, s->big, &s->outlen);
	if (s->rv == 0x91) {
		// NSS 3.87 ends the operation on CKR_BUFFER_TOO_SMALL, which the
		// specification says leaves it active: start it again.
		r = hg_one_shot(s->fl, s->kind, s->session, s->mech, s->plen ? param : NULL, s->plen,
		                s->key, in, s->inlen, s->big, s->bigcap);
		s->rv = r.rv;
		s->outlen = r.len;
	}
}

static void *hg_shot_runner(void) { return (void *)hg_shot_run; }

static void hg_shot_free(hg_shot *s) {
	free(s->buf);
	free(s->big);
	free(s);
}

static hg_ulong hg_get(void *fl, hg_ulong session, hg_ulong obj, hg_attr *tmpl, hg_ulong n) {
	hg_get_attribute_value f = (hg_get_attribute_value)((hg_function_list *)fl)->fn[HG_FN_GET_ATTRIBUTE_VALUE];
	return f(session, obj, tmpl, n);
}

// hg_get_nested reads the attribute array held by attribute type of obj.
// On CKR_OK *out holds *n entries whose pValue buffers, like *out itself,
// are malloc'd; free them with hg_free_attrs.
static hg_ulong hg_get_nested(void *fl, hg_ulong session, hg_ulong obj, hg_ulong type,
                              hg_attr **out, hg_ulong *n) {
	hg_attr a = { type, NULL, 0 };
	*out = NULL;
	*n = 0;
	hg_ulong rv = hg_get(fl, session, obj, &a, 1);
	if (rv != 0) {
		return rv;
	}
	if (a.ulValueLen == (hg_ulong)-1 || a.ulValueLen % sizeof(hg_attr) != 0) {
		return 0x12; // CKR_ATTRIBUTE_TYPE_INVALID: not an attribute array
	}
	hg_ulong count = a.ulValueLen / sizeof(hg_attr);
	if (count == 0) {
		return 0;
	}
	hg_attr *arr = calloc(count, sizeof(hg_attr));
	if (arr == NULL) {
		return 0x02; // CKR_HOST_MEMORY
	}
	// Second call: the module fills in each element's type and length.
	a.pValue = arr;
	rv = hg_get(fl, session, obj, &a, 1);
	if (rv != 0) {
		free(arr);
		return rv;
	}
	for (hg_ulong i = 0; i < count; i++) {
		if (arr[i].ulValueLen == (hg_ulong)-1) {
			arr[i].ulValueLen = 0;
		}
		arr[i].pValue = arr[i].ulValueLen ? malloc(arr[i].ulValueLen) : NULL;
		if (arr[i].ulValueLen && arr[i].pValue == NULL) {
			for (hg_ulong j = 0; j < i; j++) free(arr[j].pValue);
			free(arr);
			return 0x02;
		}
	}
	// Third call: the values.
	rv = hg_get(fl, session, obj, &a, 1);
	if (rv != 0) {
		for (hg_ulong i = 0; i < count; i++) free(arr[i].pValue);
		free(arr);
		return rv;
	}
	*out = arr;
	*n = count;
	return 0;
}

static void hg_free_attrs(hg_attr *a, hg_ulong n) {
	if (a == NULL) {
		return;
	}
	for (hg_ulong i = 0; i < n; i++) {
		free(a[i].pValue);
	}
	free(a);
}

static hg_attr *hg_attr_at(hg_attr *a, hg_ulong i) { return &a[i]; }
*/
import "C"

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"sort"
	"unsafe"

	"github.com/miekg/pkcs11"
)

// FunctionList returns the CK_FUNCTION_LIST of c, loaded from path.
//
// miekg/pkcs11 keeps it private, and fetching it again with
// C_GetFunctionList is not equivalent for every module: p11-kit-client.so
// builds a new, uninitialised module (bound to the P11_KIT_SERVER_ADDRESS
// of the moment) on every call. So it is read from the context itself, after
// checking that the context's library handle is the one of path, which
// would catch a change of miekg's layout.
func FunctionList(c *pkcs11.Ctx, path string) (unsafe.Pointer, error) {
	if c == nil {
		return nil, errors.New("no module context")
	}
	// pkcs11.Ctx (v1.1.2) is struct{ ctx *C.struct_ctx }.
	inner := *(*unsafe.Pointer)(unsafe.Pointer(c))
	if inner == nil {
		return nil, errors.New("module context already destroyed")
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var fl unsafe.Pointer
	switch rc := C.hg_function_list_of(inner, cpath, &fl); rc {
	case 0:
		return fl, nil
	case 1:
		return nil, fmt.Errorf("module %s is not loaded", path)
	case 2:
		return nil, fmt.Errorf("module context of %s has an unexpected layout (miekg/pkcs11 changed?)", path)
	default:
		return nil, fmt.Errorf("module %s has an implausible function list", path)
	}
}

// Initialize calls C_Initialize on c, with CKF_OS_LOCKING_OK as miekg does
// and, when args is not empty, args as the NUL-terminated string in
// pReserved (p11-kit's x-init-reserved): how NSS softokn is told its
// database. The string is C memory, freed once the call returns (a module
// parses it during C_Initialize).
func Initialize(c *pkcs11.Ctx, args string) error {
	if args == "" {
		return c.Initialize()
	}
	p := C.CString(args)
	defer C.free(unsafe.Pointer(p))
	return c.Initialize(pkcs11.InitializeWithReserved(unsafe.Pointer(p)))
}

// ExportedSymbol returns the address of an exported symbol of a loaded
// module, nil when absent. Used by tests to check the function list layout.
func ExportedSymbol(path, name string) unsafe.Pointer {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return C.hg_symbol(cpath, cname)
}

// FunctionListEntry returns entry i of a function list (tests).
func FunctionListEntry(fl unsafe.Pointer, i int) unsafe.Pointer {
	return C.hg_fn(fl, C.int(i))
}

// cArena holds C memory for one call and frees it all at once.
type cArena []unsafe.Pointer

func (a *cArena) alloc(n int) unsafe.Pointer {
	if n == 0 {
		n = 1
	}
	p := C.calloc(C.size_t(n), 1)
	if p == nil {
		panic("p11raw: out of C memory")
	}
	*a = append(*a, p)
	return p
}

func (a *cArena) bytes(b []byte) (unsafe.Pointer, C.hg_ulong) {
	if len(b) == 0 {
		return nil, 0
	}
	p := a.alloc(len(b))
	copy(unsafe.Slice((*byte)(p), len(b)), b)
	return p, C.hg_ulong(len(b))
}

func (a *cArena) free() {
	for _, p := range *a {
		C.free(p)
	}
	*a = nil
}

// attrs builds a C CK_ATTRIBUTE array from tmpl in arena memory.
func (a *cArena) attrs(tmpl []*pkcs11.Attribute) (*C.hg_attr, C.hg_ulong) {
	if len(tmpl) == 0 {
		return nil, 0
	}
	size := C.sizeof_hg_attr * len(tmpl)
	arr := (*C.hg_attr)(a.alloc(size))
	for i, at := range tmpl {
		e := C.hg_attr_at(arr, C.hg_ulong(i))
		e._type = C.hg_ulong(at.Type)
		e.pValue, e.ulValueLen = a.bytes(at.Value)
	}
	return arr, C.hg_ulong(len(tmpl))
}

// CreateObjectNested calls C_CreateObject through fl with tmpl plus one
// attribute-array attribute per entry of nested.
func CreateObjectNested(fl unsafe.Pointer, sh pkcs11.SessionHandle, tmpl []*pkcs11.Attribute, nested map[uint][]*pkcs11.Attribute) (pkcs11.ObjectHandle, error) {
	var arena cArena
	defer arena.free()
	types := make([]uint, 0, len(nested))
	for t := range nested {
		types = append(types, t)
	}
	sort.Slice(types, func(i, j int) bool { return types[i] < types[j] })

	n := len(tmpl) + len(types)
	arr := (*C.hg_attr)(arena.alloc(C.sizeof_hg_attr * n))
	for i, at := range tmpl {
		e := C.hg_attr_at(arr, C.hg_ulong(i))
		e._type = C.hg_ulong(at.Type)
		e.pValue, e.ulValueLen = arena.bytes(at.Value)
	}
	for j, t := range types {
		inner, count := arena.attrs(nested[t])
		e := C.hg_attr_at(arr, C.hg_ulong(len(tmpl)+j))
		e._type = C.hg_ulong(t)
		e.pValue = unsafe.Pointer(inner)
		e.ulValueLen = count * C.sizeof_hg_attr
	}
	var obj C.hg_ulong
	if rv := C.hg_create(fl, C.hg_ulong(sh), arr, C.hg_ulong(n), &obj); rv != 0 {
		return 0, pkcs11.Error(rv)
	}
	return pkcs11.ObjectHandle(obj), nil
}

// GetNestedAttribute reads the attribute array held by attribute typ of object h.
func GetNestedAttribute(fl unsafe.Pointer, sh pkcs11.SessionHandle, h pkcs11.ObjectHandle, typ uint) ([]*pkcs11.Attribute, error) {
	var arr *C.hg_attr
	var n C.hg_ulong
	if rv := C.hg_get_nested(fl, C.hg_ulong(sh), C.hg_ulong(h), C.hg_ulong(typ), &arr, &n); rv != 0 {
		return nil, pkcs11.Error(rv)
	}
	defer C.hg_free_attrs(arr, n)
	out := make([]*pkcs11.Attribute, 0, int(n))
	for i := C.hg_ulong(0); i < n; i++ {
		e := C.hg_attr_at(arr, i)
		var v []byte
		if e.ulValueLen > 0 {
			v = C.GoBytes(e.pValue, C.int(e.ulValueLen))
		}
		out = append(out, &pkcs11.Attribute{Type: uint(e._type), Value: v})
	}
	return out, nil
}

// Kind is an operation made of an Init and a single-part call, for a Shot.
type Kind int

// The kinds (their Init's place in the function list).
const (
	Encrypt Kind = C.HG_FN_ENCRYPT_INIT
	Decrypt Kind = C.HG_FN_DECRYPT_INIT
	Digest  Kind = C.HG_FN_DIGEST_INIT
	Sign    Kind = C.HG_FN_SIGN_INIT
	Verify  Kind = C.HG_FN_VERIFY_INIT
)

// generatorField is the index of pkcs11.Mechanism's unexported generator
// (a parameter miekg builds from a Go value at the call), -1 if none.
var generatorField = func() int {
	f, ok := reflect.TypeFor[pkcs11.Mechanism]().FieldByName("generator")
	if !ok {
		return -1
	}
	return f.Index[0]
}()

// PlainMechanism reports whether m's parameter is its Parameter bytes as
// they are (no Go value miekg turns into a structure at the call).
func PlainMechanism(m *pkcs11.Mechanism) bool {
	return generatorField < 0 || reflect.ValueOf(m).Elem().Field(generatorField).IsNil()
}

// fitted is out cut to the n bytes the module wrote.
func fitted(out []byte, n C.hg_ulong) ([]byte, error) {
	if n > C.hg_ulong(len(out)) {
		return nil, fmt.Errorf("%w: the module wrote %d bytes into %d", pkcs11.Error(pkcs11.CKR_GENERAL_ERROR), n, len(out))
	}
	return out[:n:n], nil
}

// Shot is an Init and its single-part call kept in C memory, made in one
// crossing into C (Call), or in C by a worker that never comes back to Go
// (pkg/slot's handoff worker, through internal/handoff): Set on the
// caller's side before the post, Run on the worker, Result on the caller's
// side after the answer. A worker whose caller gave up may still be making
// the call: then the Shot is the worker's, to Free when the call is over.
type Shot struct{ p *C.hg_shot }

// NewShot allocates a Shot. Its C memory is released by Free, once no
// call is in flight, or else once the Shot is unreachable (no call can be
// in flight then: a call in flight holds its Shot).
func NewShot() *Shot {
	p := (*C.hg_shot)(C.calloc(1, C.sizeof_hg_shot))
	if p == nil {
		panic("p11raw: out of C memory")
	}
	s := &Shot{p}
	runtime.SetFinalizer(s, (*Shot).Free)
	return s
}

// Free releases the Shot's C memory.
func (s *Shot) Free() {
	if s.p == nil {
		return
	}
	runtime.SetFinalizer(s, nil)
	C.hg_shot_free(s.p)
	s.p = nil
}

// Call makes the call Set put in the Shot, on the calling goroutine: what
// Run does on a worker in C.
func (s *Shot) Call() {
	C.hg_shot_run(unsafe.Pointer(s.p))
	runtime.KeepAlive(s) // (its finalizer frees the memory the call uses)
}

// Run is the C function that makes the call (void (*)(void *)), and Arg
// its argument.
func (s *Shot) Run() unsafe.Pointer { return C.hg_shot_runner() }

// Arg is Run's argument.
func (s *Shot) Arg() unsafe.Pointer { return unsafe.Pointer(s.p) }

// Set copies the call's arguments into the Shot: k's Init with m (plain:
// see PlainMechanism) and key (none for Digest), then its single-part call
// on in; for Verify, sig is the signature. The output is written to hint
// bytes when it fits, else to as many as the module asks for (the
// operation stays active after CKR_BUFFER_TOO_SMALL).
func (s *Shot) Set(fl unsafe.Pointer, k Kind, sh pkcs11.SessionHandle, m *pkcs11.Mechanism, key pkcs11.ObjectHandle, in, sig []byte, hint int) {
	p := s.p
	outcap := len(sig)
	if k != Verify {
		if hint <= 0 {
			hint = 512 // an RSA-4096 signature
		}
		outcap = hint
	}
	need := len(m.Parameter) + len(in) + outcap + 1
	if C.hg_ulong(need) > p.cap {
		C.free(unsafe.Pointer(p.buf))
		p.buf = (*C.uchar)(C.malloc(C.size_t(need)))
		if p.buf == nil {
			panic("p11raw: out of C memory")
		}
		p.cap = C.hg_ulong(need)
	}
	buf := unsafe.Slice((*byte)(unsafe.Pointer(p.buf)), need)
	n := copy(buf, m.Parameter)
	n += copy(buf[n:], in)
	copy(buf[n:], sig)
	p.fl, p.kind, p.session, p.mech, p.key = fl, C.int(k), C.hg_ulong(sh), C.hg_ulong(m.Mechanism), C.hg_ulong(key)
	p.plen, p.inlen, p.outcap = C.hg_ulong(len(m.Parameter)), C.hg_ulong(len(in)), C.hg_ulong(outcap)
}

// Result is the answered call's output (nil for Verify) or error.
func (s *Shot) Result() ([]byte, error) {
	p := s.p
	if p.rv != pkcs11.CKR_OK {
		return nil, pkcs11.Error(p.rv)
	}
	if Kind(p.kind) == Verify {
		return nil, nil
	}
	out, capacity := unsafe.Pointer(uintptr(unsafe.Pointer(p.buf))+uintptr(p.plen+p.inlen)), p.outcap
	if p.bigcap != 0 {
		out, capacity = unsafe.Pointer(p.big), p.bigcap
	}
	written, err := fitted(unsafe.Slice((*byte)(out), int(capacity)), p.outlen)
	if err != nil {
		return nil, err
	}
	return bytes.Clone(written), nil // out of the C memory the next call writes
}
