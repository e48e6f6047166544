package main

/*
#include "hapkcs11.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/hagroup/hagroup/internal/mechparam"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// The Go half of every PKCS#11 entry point (the C half is in entry.c and
// forward.c). Each converts C arguments, calls the library and converts
// the result; call() recovers panics so none crosses into C.

// module is the process's one PKCS#11 module state: the process really is
// global here (an application loads the library once). Calls hold the read
// lock; C_Initialize and C_Finalize the write lock, so C_Finalize waits for
// calls in flight (after cancelling them).
var module struct {
	sync.RWMutex
	lib *library
}

// call runs fn on the initialized library and returns its CKR code.
func call(name string, fn func(l *library) error) (rv C.CK_RV) {
	l := enter()
	defer leave(name, &rv)
	if l == nil {
		return C.CKR_CRYPTOKI_NOT_INITIALIZED
	}
	return l.rv(name, fn(l))
}

// enter begins a call: it takes the module's read lock and returns the
// initialized library, nil before C_Initialize. The caller defers leave.
func enter() *library {
	module.RLock()
	return module.lib
}

// leave ends a call that enter began: a panic becomes CKR_GENERAL_ERROR
// (none crosses into C), and the module's lock is let go.
func leave(name string, rv *C.CK_RV) {
	if r := recover(); r != nil {
		logPanic(name, r, debug.Stack())
		*rv = C.CKR_GENERAL_ERROR
	}
	module.RUnlock()
}

// rv is the CKR code of a call's error, logged when it is one and the log
// is at debug level.
func (l *library) rv(name string, err error) C.CK_RV {
	code := codeOf(err)
	if code != pkcs11.CKR_OK && l.log.debugging() {
		l.log.debug("call failed", "call", name, "rv", fmt.Sprintf("%#x", code))
	}
	return C.CK_RV(code)
}

// codeOf maps an error to the CKR code the application sees.
func codeOf(err error) uint {
	if err == nil {
		return pkcs11.CKR_OK
	}
	if pe, ok := err.(pkcs11.Error); ok {
		return uint(pe)
	}
	return group.CodeOf(err)
}

// errArgs is CKR_ARGUMENTS_BAD.
var errArgs = ckErr(pkcs11.CKR_ARGUMENTS_BAD)

//export hapInitialize
func hapInitialize(flags C.CK_FLAGS, serving C.int) (rv C.CK_RV) {
	defer func() {
		if r := recover(); r != nil {
			logPanic("C_Initialize", r, debug.Stack())
			rv = C.CKR_GENERAL_ERROR
		}
	}()
	module.Lock()
	defer module.Unlock()
	if module.lib != nil {
		return C.CKR_CRYPTOKI_ALREADY_INITIALIZED
	}
	l, err := newLibrary(serving != 0)
	if errors.Is(err, errUseHelper) {
		return C.HAP_RV_USE_HELPER
	}
	if err != nil {
		return C.CK_RV(codeOf(err))
	}
	spareP()
	if serving != 0 {
		helperGC()
	}
	module.lib = l
	return C.CKR_OK
}

//export hapFinalize
func hapFinalize() (rv C.CK_RV) {
	defer func() {
		if r := recover(); r != nil {
			logPanic("C_Finalize", r, debug.Stack())
			rv = C.CKR_GENERAL_ERROR
		}
	}()
	module.RLock()
	l := module.lib
	module.RUnlock()
	if l == nil {
		return C.CKR_CRYPTOKI_NOT_INITIALIZED
	}
	l.cancel() // calls in flight give up, so the write lock comes quickly
	module.Lock()
	defer module.Unlock()
	if module.lib != l {
		return C.CKR_CRYPTOKI_NOT_INITIALIZED
	}
	module.lib = nil
	if err := l.finalize(); err != nil {
		l.log.event("", "", "finalize_failed", err.Error())
	}
	l.log.close()
	return C.CKR_OK
}

// ---- conversions ----

// goBytes copies n bytes from C (nil for a NULL pointer).
func goBytes(p C.CK_BYTE_PTR, n C.CK_ULONG) ([]byte, error) {
	if p == nil {
		if n != 0 {
			return nil, errArgs
		}
		return nil, nil
	}
	return C.GoBytes(unsafe.Pointer(p), C.int(n)), nil
}

// cSlice views n C values of type T at p.
func cSlice[T any](p *T, n C.CK_ULONG) []T {
	if p == nil || n == 0 {
		return nil
	}
	return unsafe.Slice(p, int(n))
}

func attrsIn(p C.CK_ATTRIBUTE_PTR, n C.CK_ULONG) ([]*pkcs11.Attribute, error) {
	if p == nil && n != 0 {
		return nil, errArgs
	}
	in := cSlice(p, n)
	out := make([]*pkcs11.Attribute, len(in))
	for i, a := range in {
		v, err := goBytes(C.CK_BYTE_PTR(a.pValue), a.ulValueLen)
		if err != nil {
			return nil, ckErr(pkcs11.CKR_ATTRIBUTE_VALUE_INVALID)
		}
		out[i] = &pkcs11.Attribute{Type: uint(a._type), Value: v}
	}
	return out, nil
}

// mechIn converts a mechanism; its parameter is copied as bytes, and a
// parameter that holds pointers (CK_GCM_PARAMS …) with what they point at
// (ownParam). A mechanism without a parameter is a shared value
// (plainMech).
func mechIn(p C.CK_MECHANISM_PTR) (*pkcs11.Mechanism, error) {
	if p == nil {
		return nil, nil
	}
	if p.pParameter == nil && p.ulParameterLen == 0 {
		return plainMech(uint(p.mechanism)), nil
	}
	param, err := goBytes(C.CK_BYTE_PTR(p.pParameter), p.ulParameterLen)
	if err != nil {
		return nil, ckErr(pkcs11.CKR_MECHANISM_PARAM_INVALID)
	}
	m := &pkcs11.Mechanism{Mechanism: uint(p.mechanism)}
	if param != nil {
		if m.Parameter, err = ownParam(m.Mechanism, param); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// maxParamTargets bounds what a parameter's pointers may point at in all:
// as the helper's frame (rpc.h's HAP_MAX_FRAME).
const maxParamTargets = 16 << 20

// ownParam returns a parameter the engine may use after the call that gave
// it: the application's pointers are valid only during that call (PKCS#11
// v2.40, 5.2), and the engine may send an Init to a member later, with its
// call (a proven Init, a failover). A structure that holds pointers is
// copied with what they point at into C memory the returned bytes own
// (freed once they are unreachable); any other parameter, and a structure
// whose length is not its layout's (the token answers that), is its bytes.
func ownParam(mech uint, raw []byte) ([]byte, error) {
	l := mechparam.For(mech)
	if l == nil || l.Refused != "" || len(raw) != l.Size {
		return raw, nil
	}
	v, err := mechparam.FromRaw(l, raw, maxParamTargets)
	if err != nil {
		return nil, ckErr(pkcs11.CKR_MECHANISM_PARAM_INVALID)
	}
	owned, free, err := mechparam.Build(v)
	if err != nil {
		return nil, ckErr(pkcs11.CKR_MECHANISM_PARAM_INVALID)
	}
	runtime.AddCleanup(&owned[0], func(free func()) { free() }, free)
	return owned, nil
}

// plainMechs holds one shared mechanism, without a parameter, per type
// below len(plainMechs) (every standard signing mechanism), so that a
// signer's C_SignInit allocates none. Nothing changes a mechanism once
// made: the group keeps it as it is, for the operation and its proofs.
var plainMechs [0x1200]atomic.Pointer[pkcs11.Mechanism]

// plainMech is the mechanism of type t without a parameter.
func plainMech(t uint) *pkcs11.Mechanism {
	if t >= uint(len(plainMechs)) {
		return &pkcs11.Mechanism{Mechanism: t}
	}
	if m := plainMechs[t].Load(); m != nil {
		return m
	}
	m := &pkcs11.Mechanism{Mechanism: t}
	if plainMechs[t].CompareAndSwap(nil, m) {
		return m
	}
	return plainMechs[t].Load()
}

// cOut is an output buffer with the spec's convention: a NULL buffer asks
// for the length; a short one gets CKR_BUFFER_TOO_SMALL and the length.
type cOut struct {
	p C.CK_BYTE_PTR
	n C.CK_ULONG_PTR
}

func (o cOut) room() group.Room {
	if o.p == nil {
		return group.RoomQuery
	}
	return group.Room(min(uint64(*o.n), uint64(group.RoomAny)))
}

func (o cOut) put(b []byte) {
	if o.p != nil && int(*o.n) >= len(b) {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(o.p)), len(b)), b)
	}
	*o.n = C.CK_ULONG(len(b))
}

// putAll hands b out whole (C_WrapKey): CKR_BUFFER_TOO_SMALL when it
// does not fit, the length alone for a NULL buffer.
func (o cOut) putAll(b []byte) error {
	if o.n == nil {
		return errArgs
	}
	fits := o.p == nil || int(*o.n) >= len(b)
	o.put(b)
	if !fits {
		return ckErr(pkcs11.CKR_BUFFER_TOO_SMALL)
	}
	return nil
}

// padded writes s into a blank-padded fixed-size PKCS#11 string field.
func padded(dst []C.CK_UTF8CHAR, s string) {
	for i := range dst {
		dst[i] = ' '
	}
	b := []byte(s)
	if len(b) > len(dst) {
		b = b[:len(dst)]
	}
	for i, c := range b {
		dst[i] = C.CK_UTF8CHAR(c)
	}
}

func version(v pkcs11.Version) C.CK_VERSION {
	return C.CK_VERSION{major: C.CK_BYTE(v.Major), minor: C.CK_BYTE(v.Minor)}
}

// handlesOut writes a list with the NULL-means-length convention (used by
// C_GetSlotList and C_GetMechanismList).
func handlesOut[T ~uint64](list []uint, p *T, n C.CK_ULONG_PTR) error {
	if n == nil {
		return errArgs
	}
	if p == nil {
		*n = C.CK_ULONG(len(list))
		return nil
	}
	if int(*n) < len(list) {
		*n = C.CK_ULONG(len(list))
		return ckErr(pkcs11.CKR_BUFFER_TOO_SMALL)
	}
	out := unsafe.Slice(p, len(list))
	for i, v := range list {
		out[i] = T(v)
	}
	*n = C.CK_ULONG(len(list))
	return nil
}

// ---- general purpose, slots and tokens ----

//export hapGetInfo
func hapGetInfo(p C.CK_INFO_PTR) C.CK_RV {
	return call("C_GetInfo", func(l *library) error {
		if p == nil {
			return errArgs
		}
		p.cryptokiVersion = C.CK_VERSION{major: 2, minor: 40}
		padded(p.manufacturerID[:], manufacturer)
		p.flags = 0
		padded(p.libraryDescription[:], "hagroup HA PKCS#11 client")
		p.libraryVersion = C.CK_VERSION{major: libraryMajor, minor: libraryMinor}
		return nil
	})
}

//export hapGetSlotList
func hapGetSlotList(present C.CK_BBOOL, p C.CK_SLOT_ID_PTR, n C.CK_ULONG_PTR) C.CK_RV {
	return call("C_GetSlotList", func(l *library) error {
		return handlesOut(l.getSlotList(present != 0), p, n)
	})
}

//export hapGetSlotInfo
func hapGetSlotInfo(id C.CK_SLOT_ID, p C.CK_SLOT_INFO_PTR) C.CK_RV {
	return call("C_GetSlotInfo", func(l *library) error {
		if p == nil {
			return errArgs
		}
		s, err := l.slot(uint(id))
		if err != nil {
			return err
		}
		si := s.tok.SlotInfo()
		padded(p.slotDescription[:], si.Description)
		padded(p.manufacturerID[:], si.Manufacturer)
		p.flags = 0
		if si.Present {
			p.flags |= C.CKF_TOKEN_PRESENT
		}
		if si.Hardware {
			p.flags |= C.CKF_HW_SLOT
		}
		p.hardwareVersion = C.CK_VERSION{major: libraryMajor, minor: libraryMinor}
		p.firmwareVersion = C.CK_VERSION{major: libraryMajor, minor: libraryMinor}
		return nil
	})
}

//export hapGetTokenInfo
func hapGetTokenInfo(id C.CK_SLOT_ID, p C.CK_TOKEN_INFO_PTR) C.CK_RV {
	return call("C_GetTokenInfo", func(l *library) error {
		if p == nil {
			return errArgs
		}
		s, err := l.token(uint(id))
		if err != nil {
			return err
		}
		ti, err := s.tok.TokenInfo(l.ctx)
		if err != nil {
			return err
		}
		padded(p.label[:], ti.Label)
		padded(p.manufacturerID[:], ti.ManufacturerID)
		padded(p.model[:], ti.Model)
		padded(p.serialNumber[:], ti.SerialNumber)
		p.flags = C.CK_FLAGS(ti.Flags)
		p.ulMaxSessionCount = C.CK_ULONG(ti.MaxSessionCount)
		p.ulSessionCount = C.CK_ULONG(ti.SessionCount)
		p.ulMaxRwSessionCount = C.CK_ULONG(ti.MaxRwSessionCount)
		p.ulRwSessionCount = C.CK_ULONG(ti.RwSessionCount)
		p.ulMaxPinLen = C.CK_ULONG(ti.MaxPinLen)
		p.ulMinPinLen = C.CK_ULONG(ti.MinPinLen)
		p.ulTotalPublicMemory = C.CK_ULONG(ti.TotalPublicMemory)
		p.ulFreePublicMemory = C.CK_ULONG(ti.FreePublicMemory)
		p.ulTotalPrivateMemory = C.CK_ULONG(ti.TotalPrivateMemory)
		p.ulFreePrivateMemory = C.CK_ULONG(ti.FreePrivateMemory)
		p.hardwareVersion = version(ti.HardwareVersion)
		p.firmwareVersion = version(ti.FirmwareVersion)
		utc := make([]C.CK_CHAR, len(p.utcTime))
		for i := range utc {
			utc[i] = ' '
			if i < len(ti.UTCTime) {
				utc[i] = C.CK_CHAR(ti.UTCTime[i])
			}
		}
		copy(p.utcTime[:], utc)
		return nil
	})
}

//export hapGetMechanismList
func hapGetMechanismList(id C.CK_SLOT_ID, p C.CK_MECHANISM_TYPE_PTR, n C.CK_ULONG_PTR) C.CK_RV {
	return call("C_GetMechanismList", func(l *library) error {
		list, err := l.mechanismList(uint(id))
		if err != nil {
			return err
		}
		return handlesOut(list, p, n)
	})
}

//export hapGetMechanismInfo
func hapGetMechanismInfo(id C.CK_SLOT_ID, mech C.CK_MECHANISM_TYPE, p C.CK_MECHANISM_INFO_PTR) C.CK_RV {
	return call("C_GetMechanismInfo", func(l *library) error {
		if p == nil {
			return errArgs
		}
		s, err := l.token(uint(id))
		if err != nil {
			return err
		}
		mechs, _, err := s.mechanisms(l.ctx)
		if err != nil {
			return err
		}
		if _, ok := mechs[uint(mech)]; !ok {
			return ckErr(pkcs11.CKR_MECHANISM_INVALID)
		}
		mi, err := s.tok.MechanismInfo(l.ctx, uint(mech))
		if err != nil {
			return err
		}
		p.ulMinKeySize = C.CK_ULONG(mi.MinKeySize)
		p.ulMaxKeySize = C.CK_ULONG(mi.MaxKeySize)
		p.flags = C.CK_FLAGS(mi.Flags)
		return nil
	})
}

//export hapInitToken
func hapInitToken(id C.CK_SLOT_ID, pin C.CK_UTF8CHAR_PTR, pinLen C.CK_ULONG, label C.CK_UTF8CHAR_PTR) C.CK_RV {
	return call("C_InitToken", func(l *library) error {
		if _, err := l.slot(uint(id)); err != nil {
			return err
		}
		// Re-initialising would wipe a member (or, for a virtual slot,
		// every member): that is an operator's job, not an application's.
		return ckErr(pkcs11.CKR_FUNCTION_NOT_SUPPORTED)
	})
}

// ---- sessions ----

//export hapOpenSession
func hapOpenSession(id C.CK_SLOT_ID, flags C.CK_FLAGS, app C.CK_VOID_PTR, notify C.CK_NOTIFY, ph C.CK_SESSION_HANDLE_PTR) C.CK_RV {
	return call("C_OpenSession", func(l *library) error {
		if ph == nil {
			return errArgs
		}
		if flags&C.CKF_SERIAL_SESSION == 0 {
			return ckErr(pkcs11.CKR_SESSION_PARALLEL_NOT_SUPPORTED)
		}
		h, err := l.openSession(uint(id), flags&C.CKF_RW_SESSION != 0)
		if err != nil {
			return err
		}
		*ph = C.CK_SESSION_HANDLE(h)
		return nil
	})
}

//export hapCloseSession
func hapCloseSession(h C.CK_SESSION_HANDLE) C.CK_RV {
	return call("C_CloseSession", func(l *library) error { return l.closeSession(uint(h)) })
}

//export hapCloseAllSessions
func hapCloseAllSessions(id C.CK_SLOT_ID) C.CK_RV {
	return call("C_CloseAllSessions", func(l *library) error { return l.closeAllSessions(uint(id)) })
}

//export hapGetSessionInfo
func hapGetSessionInfo(h C.CK_SESSION_HANDLE, p C.CK_SESSION_INFO_PTR) C.CK_RV {
	return call("C_GetSessionInfo", func(l *library) error {
		if p == nil {
			return errArgs
		}
		id, state, flags, err := l.sessionInfo(uint(h))
		if err != nil {
			return err
		}
		p.slotID = C.CK_SLOT_ID(id)
		p.state = C.CK_STATE(state)
		p.flags = C.CK_FLAGS(flags)
		p.ulDeviceError = 0
		return nil
	})
}

//export hapLogin
func hapLogin(h C.CK_SESSION_HANDLE, userType C.CK_USER_TYPE, pin C.CK_UTF8CHAR_PTR, pinLen C.CK_ULONG) C.CK_RV {
	return call("C_Login", func(l *library) error {
		if pin == nil && pinLen != 0 {
			return errArgs
		}
		var p secret.PIN
		if pin != nil {
			b := unsafe.Slice((*byte)(unsafe.Pointer(pin)), int(pinLen))
			p = secret.NewPIN(b)
		}
		return l.login(uint(h), uint(userType), p)
	})
}

//export hapLogout
func hapLogout(h C.CK_SESSION_HANDLE) C.CK_RV {
	return call("C_Logout", func(l *library) error { return l.logout(uint(h)) })
}

// ---- objects ----

// newObject ends a call that makes one object from tmpl on session h
// (C_CreateObject, C_CopyObject, C_GenerateKey, C_UnwrapKey, C_DeriveKey):
// the session must be allowed to make it, and its handle goes to ph.
func newObject(l *library, h C.CK_SESSION_HANDLE, tmpl []*pkcs11.Attribute, ph C.CK_OBJECT_HANDLE_PTR, mk func(s *appSession) (uint, error)) error {
	if ph == nil {
		return errArgs
	}
	return l.withSession(uint(h), func(s *appSession) error {
		if err := l.writable(s, tmpl); err != nil {
			return err
		}
		o, err := mk(s)
		if err != nil {
			return err
		}
		*ph = C.CK_OBJECT_HANDLE(o)
		return nil
	})
}

//export hapCreateObject
func hapCreateObject(h C.CK_SESSION_HANDLE, p C.CK_ATTRIBUTE_PTR, n C.CK_ULONG, ph C.CK_OBJECT_HANDLE_PTR) C.CK_RV {
	return call("C_CreateObject", func(l *library) error {
		if p == nil {
			return errArgs // a template is required, even an empty one (as SoftHSM answers)
		}
		tmpl, err := attrsIn(p, n)
		if err != nil {
			return err
		}
		return newObject(l, h, tmpl, ph, func(s *appSession) (uint, error) { return s.be.CreateObject(l.ctx, tmpl) })
	})
}

//export hapCopyObject
func hapCopyObject(h C.CK_SESSION_HANDLE, obj C.CK_OBJECT_HANDLE, p C.CK_ATTRIBUTE_PTR, n C.CK_ULONG, ph C.CK_OBJECT_HANDLE_PTR) C.CK_RV {
	return call("C_CopyObject", func(l *library) error {
		tmpl, err := attrsIn(p, n)
		if err != nil {
			return err
		}
		return newObject(l, h, tmpl, ph, func(s *appSession) (uint, error) {
			defer l.changes.Add(1)
			return s.be.CopyObject(l.ctx, uint(obj), tmpl)
		})
	})
}

//export hapDestroyObject
func hapDestroyObject(h C.CK_SESSION_HANDLE, obj C.CK_OBJECT_HANDLE) C.CK_RV {
	return call("C_DestroyObject", func(l *library) error {
		return l.changing(uint(h), func(s *appSession) error {
			if err := l.writableObject(s, uint(obj)); err != nil {
				return err
			}
			return s.be.DestroyObject(l.ctx, uint(obj))
		})
	})
}

//export hapGetObjectSize
func hapGetObjectSize(h C.CK_SESSION_HANDLE, obj C.CK_OBJECT_HANDLE, n C.CK_ULONG_PTR) C.CK_RV {
	return call("C_GetObjectSize", func(l *library) error {
		if n == nil {
			return errArgs
		}
		return l.withSession(uint(h), func(s *appSession) error {
			// The handle must be valid; the size of an object spread over
			// several tokens is not one number.
			if _, err := s.be.GetAttributes(l.ctx, uint(obj), []uint{pkcs11.CKA_CLASS}); err != nil {
				return err
			}
			*n = C.CK_UNAVAILABLE_INFORMATION
			return nil
		})
	})
}

//export hapGetAttributeValue
func hapGetAttributeValue(h C.CK_SESSION_HANDLE, obj C.CK_OBJECT_HANDLE, p C.CK_ATTRIBUTE_PTR, n C.CK_ULONG) C.CK_RV {
	return call("C_GetAttributeValue", func(l *library) error {
		if p == nil && n != 0 {
			return errArgs
		}
		tmpl := cSlice(p, n)
		types := make([]uint, len(tmpl))
		for i, a := range tmpl {
			types[i] = uint(a._type)
		}
		var got []slot.Attribute
		err := l.withSession(uint(h), func(s *appSession) error {
			var err error
			got, err = l.getAttributes(s, uint(obj), types, slices.ContainsFunc(tmpl, func(a C.CK_ATTRIBUTE) bool { return a.pValue == nil }))
			return err
		})
		if err != nil {
			return err
		}
		if len(got) != len(tmpl) {
			return fmt.Errorf("backend answered %d of %d attributes", len(got), len(tmpl))
		}
		return fillAttributes(tmpl, got)
	})
}

// fillAttributes applies the spec's rules for C_GetAttributeValue to every
// attribute and returns the code for the whole call: each attribute that
// cannot be returned gets CK_UNAVAILABLE_INFORMATION, and the call reports
// CKR_ATTRIBUTE_SENSITIVE, CKR_ATTRIBUTE_TYPE_INVALID or
// CKR_BUFFER_TOO_SMALL (in that order of precedence) while still filling
// in every other attribute.
func fillAttributes(tmpl []C.CK_ATTRIBUTE, got []slot.Attribute) error {
	var sensitive, invalid, short bool
	for i := range tmpl {
		a := &tmpl[i]
		g := got[i]
		switch {
		case g.Status == pkcs11.CKR_ATTRIBUTE_SENSITIVE:
			a.ulValueLen = C.CK_UNAVAILABLE_INFORMATION
			sensitive = true
		case g.Status != pkcs11.CKR_OK:
			a.ulValueLen = C.CK_UNAVAILABLE_INFORMATION
			invalid = true
		case a.pValue == nil:
			a.ulValueLen = C.CK_ULONG(len(g.Value))
		case int(a.ulValueLen) < len(g.Value):
			a.ulValueLen = C.CK_UNAVAILABLE_INFORMATION
			short = true
		default:
			copy(unsafe.Slice((*byte)(a.pValue), len(g.Value)), g.Value)
			a.ulValueLen = C.CK_ULONG(len(g.Value))
		}
	}
	switch {
	case sensitive:
		return ckErr(pkcs11.CKR_ATTRIBUTE_SENSITIVE)
	case invalid:
		return ckErr(pkcs11.CKR_ATTRIBUTE_TYPE_INVALID)
	case short:
		return ckErr(pkcs11.CKR_BUFFER_TOO_SMALL)
	}
	return nil
}

//export hapSetAttributeValue
func hapSetAttributeValue(h C.CK_SESSION_HANDLE, obj C.CK_OBJECT_HANDLE, p C.CK_ATTRIBUTE_PTR, n C.CK_ULONG) C.CK_RV {
	return call("C_SetAttributeValue", func(l *library) error {
		attrs, err := attrsIn(p, n)
		if err != nil {
			return err
		}
		return l.changing(uint(h), func(s *appSession) error {
			if err := l.writableObject(s, uint(obj)); err != nil {
				return err
			}
			return s.be.SetAttributes(l.ctx, uint(obj), attrs)
		})
	})
}

//export hapFindObjectsInit
func hapFindObjectsInit(h C.CK_SESSION_HANDLE, p C.CK_ATTRIBUTE_PTR, n C.CK_ULONG) C.CK_RV {
	return call("C_FindObjectsInit", func(l *library) error {
		tmpl, err := attrsIn(p, n)
		if err != nil {
			return err
		}
		return l.findInit(uint(h), tmpl)
	})
}

//export hapFindObjects
func hapFindObjects(h C.CK_SESSION_HANDLE, p C.CK_OBJECT_HANDLE_PTR, max C.CK_ULONG, n C.CK_ULONG_PTR) C.CK_RV {
	return call("C_FindObjects", func(l *library) error {
		if n == nil || (p == nil && max != 0) {
			return errArgs
		}
		found, err := l.findNext(uint(h), int(max))
		if err != nil {
			return err
		}
		out := cSlice(p, C.CK_ULONG(len(found)))
		for i, o := range found {
			out[i] = C.CK_OBJECT_HANDLE(o)
		}
		*n = C.CK_ULONG(len(found))
		return nil
	})
}

//export hapFindObjectsFinal
func hapFindObjectsFinal(h C.CK_SESSION_HANDLE) C.CK_RV {
	return call("C_FindObjectsFinal", func(l *library) error { return l.findFinal(uint(h)) })
}

// ---- cryptographic operations ----

// forward.c calls hapOpInit and hapStep for every Init and step of the
// five operation families (rpcgen names each C_ function's kind and step
// by opstate's numbers), and hapRefuse for the functions of a session the
// engine refuses (rpcgen's list says which, how, and why).

// opNames are the PKCS#11 names of each family's calls, by kind and step
// (0 the Init), made once so that naming a call costs nothing per call.
var opNames = func() (n [slot.NumKinds][group.StepFinal + 1]string) {
	for k := range group.OpKind(slot.NumKinds) {
		n[k][0] = "C_" + k.InitName()
		for _, st := range []group.Step{group.StepSingle, group.StepUpdate, group.StepFinal} {
			n[k][st] = "C_" + st.Name(k)
		}
	}
	return n
}()

//export hapOpInit
func hapOpInit(h C.CK_SESSION_HANDLE, kind C.int, p C.CK_MECHANISM_PTR, key C.CK_OBJECT_HANDLE) (rv C.CK_RV) {
	k := group.OpKind(kind)
	name := opNames[k][0]
	l := enter()
	defer leave(name, &rv)
	if l == nil {
		return C.CKR_CRYPTOKI_NOT_INITIALIZED
	}
	m, err := mechIn(p)
	if err != nil {
		return l.rv(name, err)
	}
	return l.rv(name, l.opInit(uint(h), k, m, uint(key)))
}

// hapStep runs step st of an operation of kind on session h, the one way
// every C_Sign, C_EncryptUpdate, C_VerifyFinal … reaches the engine: with
// input in (for Update and the single-part call), the signature sig to
// verify (C_Verify, C_VerifyFinal), and an output buffer when withOut
// (outLen not NULL is required then). The output comes back with
// CKR_BUFFER_TOO_SMALL too: its length is the application's answer.
//
//export hapStep
func hapStep(h C.CK_SESSION_HANDLE, kind, st C.int, in C.CK_BYTE_PTR, inLen C.CK_ULONG, sig C.CK_BYTE_PTR, sigLen C.CK_ULONG, out C.CK_BYTE_PTR, outLen C.CK_ULONG_PTR, withOut C.int) (rv C.CK_RV) {
	k, s := group.OpKind(kind), group.Step(st)
	name := opNames[k][s]
	l := enter()
	defer leave(name, &rv)
	if l == nil {
		return C.CKR_CRYPTOKI_NOT_INITIALIZED
	}
	data, err := goBytes(in, inLen)
	if err != nil {
		return l.rv(name, err)
	}
	signature, err := goBytes(sig, sigLen)
	if err != nil {
		return l.rv(name, err)
	}
	room := group.RoomAny
	dst := cOut{out, outLen}
	if withOut != 0 {
		if outLen == nil {
			return l.rv(name, errArgs)
		}
		room = dst.room()
	}
	as, err := l.opSession(uint(h))
	if err != nil {
		return l.rv(name, err)
	}
	defer as.mu.Unlock()
	b, err := as.be.Do(l.ctx, k, s, data, signature, room)
	if withOut != 0 && (err == nil || codeOf(err) == pkcs11.CKR_BUFFER_TOO_SMALL) {
		dst.put(b)
	}
	return l.rv(name, err)
}

//export hapDigestKey
func hapDigestKey(h C.CK_SESSION_HANDLE, key C.CK_OBJECT_HANDLE) C.CK_RV {
	return call("C_DigestKey", func(l *library) error {
		return l.withSession(uint(h), func(s *appSession) error { return s.be.DigestKey(l.ctx, uint(key)) })
	})
}

// hapRefuse answers C_name with rv after the usual session check.
//
//export hapRefuse
func hapRefuse(h C.CK_SESSION_HANDLE, name *C.char, rv C.CK_RV) C.CK_RV {
	return call(C.GoString(name), func(l *library) error {
		return l.withSession(uint(h), func(*appSession) error { return ckErr(uint(rv)) })
	})
}

// ---- keys ----

//export hapGenerateKey
func hapGenerateKey(h C.CK_SESSION_HANDLE, m C.CK_MECHANISM_PTR, p C.CK_ATTRIBUTE_PTR, n C.CK_ULONG, ph C.CK_OBJECT_HANDLE_PTR) C.CK_RV {
	return call("C_GenerateKey", func(l *library) error {
		mech, err := mechIn(m)
		if err != nil {
			return err
		}
		tmpl, err := attrsIn(p, n)
		if err != nil {
			return err
		}
		if mech == nil {
			return errArgs
		}
		return newObject(l, h, tmpl, ph, func(s *appSession) (uint, error) { return s.be.GenerateKey(l.ctx, mech, tmpl) })
	})
}

//export hapGenerateKeyPair
func hapGenerateKeyPair(h C.CK_SESSION_HANDLE, m C.CK_MECHANISM_PTR, pubP C.CK_ATTRIBUTE_PTR, pubN C.CK_ULONG, privP C.CK_ATTRIBUTE_PTR, privN C.CK_ULONG, phPub, phPriv C.CK_OBJECT_HANDLE_PTR) C.CK_RV {
	return call("C_GenerateKeyPair", func(l *library) error {
		mech, err := mechIn(m)
		if err != nil {
			return err
		}
		pub, err := attrsIn(pubP, pubN)
		if err != nil {
			return err
		}
		priv, err := attrsIn(privP, privN)
		if err != nil {
			return err
		}
		if mech == nil || phPub == nil || phPriv == nil {
			return errArgs
		}
		return l.withSession(uint(h), func(s *appSession) error {
			if err := l.writable(s, pub); err != nil {
				return err
			}
			if err := l.writable(s, priv); err != nil {
				return err
			}
			pk, sk, err := s.be.GenerateKeyPair(l.ctx, mech, pub, priv)
			if err != nil {
				return err
			}
			*phPub, *phPriv = C.CK_OBJECT_HANDLE(pk), C.CK_OBJECT_HANDLE(sk)
			return nil
		})
	})
}

//export hapWrapKey
func hapWrapKey(h C.CK_SESSION_HANDLE, m C.CK_MECHANISM_PTR, wrapping, key C.CK_OBJECT_HANDLE, out C.CK_BYTE_PTR, outLen C.CK_ULONG_PTR) C.CK_RV {
	return call("C_WrapKey", func(l *library) error {
		mech, err := mechIn(m)
		if err != nil {
			return err
		}
		if mech == nil || outLen == nil {
			return errArgs
		}
		return l.withSession(uint(h), func(s *appSession) error {
			blob, err := s.be.WrapKey(l.ctx, mech, uint(wrapping), uint(key))
			if err != nil {
				return err
			}
			return cOut{out, outLen}.putAll(blob)
		})
	})
}

//export hapUnwrapKey
func hapUnwrapKey(h C.CK_SESSION_HANDLE, m C.CK_MECHANISM_PTR, unwrapping C.CK_OBJECT_HANDLE, in C.CK_BYTE_PTR, inLen C.CK_ULONG, p C.CK_ATTRIBUTE_PTR, n C.CK_ULONG, ph C.CK_OBJECT_HANDLE_PTR) C.CK_RV {
	return call("C_UnwrapKey", func(l *library) error {
		mech, err := mechIn(m)
		if err != nil {
			return err
		}
		blob, err := goBytes(in, inLen)
		if err != nil {
			return err
		}
		tmpl, err := attrsIn(p, n)
		if err != nil {
			return err
		}
		if mech == nil {
			return errArgs
		}
		return newObject(l, h, tmpl, ph, func(s *appSession) (uint, error) {
			return s.be.UnwrapKey(l.ctx, mech, uint(unwrapping), blob, tmpl)
		})
	})
}

//export hapDeriveKey
func hapDeriveKey(h C.CK_SESSION_HANDLE, m C.CK_MECHANISM_PTR, base C.CK_OBJECT_HANDLE, p C.CK_ATTRIBUTE_PTR, n C.CK_ULONG, ph C.CK_OBJECT_HANDLE_PTR) C.CK_RV {
	return call("C_DeriveKey", func(l *library) error {
		mech, err := mechIn(m)
		if err != nil {
			return err
		}
		tmpl, err := attrsIn(p, n)
		if err != nil {
			return err
		}
		if mech == nil {
			return errArgs
		}
		return newObject(l, h, tmpl, ph, func(s *appSession) (uint, error) { return s.be.DeriveKey(l.ctx, mech, uint(base), tmpl) })
	})
}

// ---- random, legacy, events ----

//export hapSeedRandom
func hapSeedRandom(h C.CK_SESSION_HANDLE, seed C.CK_BYTE_PTR, n C.CK_ULONG) C.CK_RV {
	return call("C_SeedRandom", func(l *library) error {
		if seed == nil && n != 0 {
			return errArgs
		}
		return l.withSession(uint(h), func(*appSession) error {
			// Seeding one member would not seed the others.
			return ckErr(pkcs11.CKR_RANDOM_SEED_NOT_SUPPORTED)
		})
	})
}

//export hapGenerateRandom
func hapGenerateRandom(h C.CK_SESSION_HANDLE, out C.CK_BYTE_PTR, n C.CK_ULONG) C.CK_RV {
	return call("C_GenerateRandom", func(l *library) error {
		if out == nil && n != 0 {
			return errArgs
		}
		return l.withSession(uint(h), func(s *appSession) error {
			b, err := s.be.GenerateRandom(l.ctx, int(n))
			if err != nil {
				return err
			}
			if len(b) != int(n) {
				return fmt.Errorf("token returned %d of %d random bytes", len(b), n)
			}
			copy(unsafe.Slice((*byte)(unsafe.Pointer(out)), int(n)), b)
			return nil
		})
	})
}

//export hapWaitForSlotEvent
func hapWaitForSlotEvent(flags C.CK_FLAGS, p C.CK_SLOT_ID_PTR, reserved C.CK_VOID_PTR) C.CK_RV {
	return call("C_WaitForSlotEvent", func(l *library) error {
		if p == nil || reserved != nil {
			return errArgs
		}
		if flags&C.CKF_DONT_BLOCK != 0 {
			// Slots never come and go: the slot list is fixed by the
			// configuration at C_Initialize.
			return ckErr(pkcs11.CKR_NO_EVENT)
		}
		return ckErr(pkcs11.CKR_FUNCTION_NOT_SUPPORTED)
	})
}
