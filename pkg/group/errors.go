package group

import (
	"errors"
	"fmt"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// Error is an error of the virtual slot: the CKR code a PKCS#11 module
// returns for it, the operation, the member at fault when there is one,
// and the cause.
type Error struct {
	Code   uint   // CKR_ code for the C boundary
	Op     string // operation, e.g. "Sign"
	Member string // member at fault; empty when none is
	Err    error  // cause; may be nil
	msg    string
}

// Error describes the operation, the member and the cause.
func (e *Error) Error() string {
	s := ""
	// The member is named once: by the cause, when it comes from it.
	member := e.Member
	if slot.NamesMember(e.Err, member) {
		member = ""
	}
	if e.Op != "" {
		s = e.Op
		if member != "" {
			s += " on member " + member
		}
	} else if member != "" {
		s = "member " + member
	}
	for _, part := range []string{e.msg, errString(e.Err)} {
		if part == "" {
			continue
		}
		if s != "" {
			s += ": "
		}
		s += part
	}
	return s
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is lets errors.Is match an *Error against the sentinels below by code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Op == "" && t.Member == "" && t.Err == nil && t.Code == e.Code && t.msg == e.msg
}

func sentinel(code uint, msg string) *Error { return &Error{Code: code, msg: msg} }

// Sentinel errors, usable with errors.Is. Each carries its CKR code.
var (
	// ErrNoMember: no member can serve the request (every member failed or
	// lacks what is needed). CKR_DEVICE_ERROR.
	ErrNoMember = sentinel(pkcs11.CKR_DEVICE_ERROR, "no healthy member")
	// ErrMemberLost: the member a multi-part operation was pinned to
	// failed mid-way; the application must start again. CKR_DEVICE_ERROR.
	ErrMemberLost = sentinel(pkcs11.CKR_DEVICE_ERROR, "member lost during multi-part operation")
	// ErrClosed: the group is closed. CKR_CRYPTOKI_NOT_INITIALIZED.
	ErrClosed = sentinel(pkcs11.CKR_CRYPTOKI_NOT_INITIALIZED, "group closed")
	// ErrSessionHandle: no such virtual session. CKR_SESSION_HANDLE_INVALID.
	ErrSessionHandle = sentinel(pkcs11.CKR_SESSION_HANDLE_INVALID, "invalid session handle")
	// ErrObjectHandle: no such virtual object. CKR_OBJECT_HANDLE_INVALID.
	ErrObjectHandle = sentinel(pkcs11.CKR_OBJECT_HANDLE_INVALID, "invalid object handle")
	// ErrKeyHandle: no such key, or no member holds it. CKR_KEY_HANDLE_INVALID.
	ErrKeyHandle = sentinel(pkcs11.CKR_KEY_HANDLE_INVALID, "invalid key handle")
	// ErrWrappingKeyHandle: no such wrapping key (C_WrapKey).
	// CKR_WRAPPING_KEY_HANDLE_INVALID.
	ErrWrappingKeyHandle = sentinel(pkcs11.CKR_WRAPPING_KEY_HANDLE_INVALID, "invalid wrapping key handle")
	// ErrUnwrappingKeyHandle: no such unwrapping key (C_UnwrapKey).
	// CKR_UNWRAPPING_KEY_HANDLE_INVALID.
	ErrUnwrappingKeyHandle = sentinel(pkcs11.CKR_UNWRAPPING_KEY_HANDLE_INVALID, "invalid unwrapping key handle")
	// ErrConflict: two different keys share the object's identity; the
	// group refuses to guess which one is meant. CKR_GENERAL_ERROR.
	ErrConflict = sentinel(pkcs11.CKR_GENERAL_ERROR, "duplicate identity with different key material")
	// ErrAlreadyLoggedIn: the virtual slot is already logged in as that
	// user. CKR_USER_ALREADY_LOGGED_IN.
	ErrAlreadyLoggedIn = sentinel(pkcs11.CKR_USER_ALREADY_LOGGED_IN, "already logged in")
	// ErrAnotherLoggedIn: the virtual slot is logged in as another user
	// type. CKR_USER_ANOTHER_ALREADY_LOGGED_IN.
	ErrAnotherLoggedIn = sentinel(pkcs11.CKR_USER_ANOTHER_ALREADY_LOGGED_IN, "another user already logged in")
	// ErrNotLoggedIn: the operation needs a login. CKR_USER_NOT_LOGGED_IN.
	ErrNotLoggedIn = sentinel(pkcs11.CKR_USER_NOT_LOGGED_IN, "not logged in")
	// ErrKeyUnextractable: the application created the key with
	// CKA_EXTRACTABLE=false. CKR_KEY_UNEXTRACTABLE.
	ErrKeyUnextractable = sentinel(pkcs11.CKR_KEY_UNEXTRACTABLE, "key is not extractable")
	// ErrReadOnly: the attribute cannot be changed that way.
	// CKR_ATTRIBUTE_READ_ONLY.
	ErrReadOnly = sentinel(pkcs11.CKR_ATTRIBUTE_READ_ONLY, "attribute read-only")
	// ErrUnknownMember: no member has that name. CKR_ARGUMENTS_BAD.
	ErrUnknownMember = sentinel(pkcs11.CKR_ARGUMENTS_BAD, "no such member")
)

// CodeOf returns the CKR code a PKCS#11 module should return for err:
// the code of an *Error, otherwise slot.CodeOf (the module's own code,
// CKR_DEVICE_ERROR for timeouts and unclassified health errors), and
// CKR_OK for nil.
func CodeOf(err error) uint {
	if err == nil {
		return pkcs11.CKR_OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return slot.CodeOf(err)
}

// wrap attaches op, member and a code to a sentinel so that errors.Is still
// matches it and the message says where it happened.
func wrap(s *Error, op, member string, cause error) *Error {
	err := cause
	if err == nil {
		err = s
	} else {
		err = fmt.Errorf("%w: %w", s, cause)
	}
	return &Error{Code: s.Code, Op: op, Member: member, Err: err}
}

// opErr names op and member on an error from a member, keeping its code.
func opErr(op, member string, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	return &Error{Code: slot.CodeOf(err), Op: op, Member: member, Err: err}
}
