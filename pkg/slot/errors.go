package slot

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hagroup/hagroup/internal/tokenquirk"
	"github.com/hagroup/hagroup/pkg/remote"
	"github.com/miekg/pkcs11"
)

// Sentinel errors. Every error this package returns for a module call is an
// *Error; errors.Is matches these sentinels against the CKR code it carries
// (and errors.As still reaches the original pkcs11.Error underneath).
var (
	// ErrTimeout: the module did not answer within the command (or key
	// generation) timeout. The call may still be running inside the module;
	// its session has been quarantined. Class: health.
	ErrTimeout = errors.New("no answer from the module before the deadline")

	// ErrDeviceFailure: the device or its client library failed
	// (CKR_DEVICE_ERROR, CKR_DEVICE_MEMORY, CKR_DEVICE_REMOVED,
	// CKR_GENERAL_ERROR, CKR_FUNCTION_FAILED). Class: health.
	ErrDeviceFailure = errors.New("device failure")

	// ErrTokenNotPresent: the token has gone (CKR_TOKEN_NOT_PRESENT,
	// CKR_TOKEN_NOT_RECOGNIZED, CKR_DEVICE_REMOVED, CKR_SLOT_ID_INVALID).
	// Class: health.
	ErrTokenNotPresent = errors.New("token not present")

	// ErrSessionLost: the session is gone (CKR_SESSION_HANDLE_INVALID,
	// CKR_SESSION_CLOSED), or a dedicated Session outlived a Reinit. Class:
	// health.
	ErrSessionLost = errors.New("session lost")

	// ErrNotInitialized: the module context is not initialised
	// (CKR_CRYPTOKI_NOT_INITIALIZED), e.g. after a failed Reinit. Class: health.
	ErrNotInitialized = errors.New("module not initialised")

	// ErrPINIncorrect: CKR_PIN_INCORRECT (and CKR_PIN_LEN_RANGE,
	// CKR_PIN_INVALID at login). Class: login.
	ErrPINIncorrect = errors.New("PIN incorrect")

	// ErrPINLocked: CKR_PIN_LOCKED. Class: login.
	ErrPINLocked = errors.New("PIN locked")

	// ErrPINExpired: CKR_PIN_EXPIRED. Class: login.
	ErrPINExpired = errors.New("PIN expired")

	// ErrTokenNotFound: no token of the module matches the spec. Class:
	// health (a member whose token is not there is down: a p11-kit member
	// whose server is down at start-up shows zero slots).
	ErrTokenNotFound = errors.New("token not found")

	// ErrClosed: the Slot or Session has been closed. Class: health (a
	// member being closed under a caller is unavailable to it).
	ErrClosed = errors.New("closed")

	// ErrNotSent is wrapped by the error of a call that never reached the
	// module: a served member's connection was down or lost before the
	// request was written (remote.ErrNotSent), or the dedicated session was
	// already broken. Such a call did nothing on the token; its class is
	// that of the error it wraps.
	ErrNotSent = remote.ErrNotSent

	// ErrInvalidSpec: a Spec or argument is unusable. Class: request.
	ErrInvalidSpec = errors.New("invalid argument")
)

// Error is the error of one operation on one member. Code is the CKR code
// the module returned, 0 when the error did not come from the module (a
// timeout, a cancelled context, a token not found). Err is the underlying
// error: a pkcs11.Error, ErrTimeout, a context error, …
type Error struct {
	Member string
	Op     Op
	Code   uint
	Err    error
	// requestAnswer: the member's make answers Code to a request it
	// cannot serve, though the code is a health code elsewhere
	// (tokenquirk.HostMemoryIsRequestError): ClassOf says ClassRequest.
	requestAnswer bool
}

// NamesMember reports whether err's message names member name already:
// err wraps an *Error of that member. A member's name is said once in an
// error chain, by this package, which is below every layer that handles a
// member's errors; the layers above name it only where it is not named.
func NamesMember(err error, name string) bool {
	var e *Error
	return errors.As(err, &e) && e.Member == name
}

func (e *Error) Error() string {
	if e.Op == "" {
		return fmt.Sprintf("member %s: %v", e.Member, e.Err)
	}
	return fmt.Sprintf("member %s: %s: %v", e.Member, e.Op, e.Err)
}

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// Is matches the package's sentinels by CKR code.
func (e *Error) Is(target error) bool {
	if e.Code == 0 {
		return false
	}
	return slices.Contains(sentinelOf[e.Code], target)
}

// sentinelOf maps CKR codes to the sentinels that match them.
var sentinelOf = map[uint][]error{
	pkcs11.CKR_DEVICE_ERROR:             {ErrDeviceFailure},
	pkcs11.CKR_DEVICE_MEMORY:            {ErrDeviceFailure},
	pkcs11.CKR_DEVICE_REMOVED:           {ErrDeviceFailure, ErrTokenNotPresent},
	pkcs11.CKR_GENERAL_ERROR:            {ErrDeviceFailure},
	pkcs11.CKR_FUNCTION_FAILED:          {ErrDeviceFailure},
	pkcs11.CKR_TOKEN_NOT_PRESENT:        {ErrTokenNotPresent},
	pkcs11.CKR_TOKEN_NOT_RECOGNIZED:     {ErrTokenNotPresent},
	pkcs11.CKR_SLOT_ID_INVALID:          {ErrTokenNotPresent},
	pkcs11.CKR_SESSION_HANDLE_INVALID:   {ErrSessionLost},
	pkcs11.CKR_SESSION_CLOSED:           {ErrSessionLost},
	pkcs11.CKR_CRYPTOKI_NOT_INITIALIZED: {ErrNotInitialized},
	pkcs11.CKR_PIN_INCORRECT:            {ErrPINIncorrect},
	pkcs11.CKR_PIN_LEN_RANGE:            {ErrPINIncorrect},
	pkcs11.CKR_PIN_INVALID:              {ErrPINIncorrect},
	pkcs11.CKR_PIN_LOCKED:               {ErrPINLocked},
	pkcs11.CKR_PIN_EXPIRED:              {ErrPINExpired},
}

// Class says whom an error is charged to.
type Class int

const (
	ClassNone    Class = iota // no error
	ClassHealth               // the member is unwell: fail over, count against it
	ClassLogin                // PIN incorrect/locked: never retried on another member
	ClassRequest              // the request is wrong: return it as it is, never charge the member
)

func (c Class) String() string {
	switch c {
	case ClassNone:
		return "none"
	case ClassHealth:
		return "health"
	case ClassLogin:
		return "login"
	case ClassRequest:
		return "request"
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// codeClass classifies every CKR code of PKCS#11 v2.40 / v3.0 as miekg
// knows them. Codes not listed (vendor codes included) are health errors:
// an answer we cannot interpret says nothing good about the member.
//
// Decisions worth a word:
//   - CKR_HOST_MEMORY is health: it is not caused by the request, and the
//     client libraries of network HSMs report their own buffer and
//     connection exhaustion with it, so another member is the best chance.
//   - CKR_USER_NOT_LOGGED_IN is request: it is what an application gets for
//     using a private object without logging in. A Slot that holds a PIN
//     and finds its login gone logs in again by itself (and bumps Epoch).
//   - CKR_KEY_HANDLE_INVALID / CKR_OBJECT_HANDLE_INVALID are request: a key
//     missing on one member is never charged to that member.
//   - CKR_TOKEN_WRITE_PROTECTED, CKR_RANDOM_NO_RNG are request: a property of
//     the token that is the same on every retry, not a failure.
//   - CKR_SESSION_COUNT, CKR_SLOT_ID_INVALID are health: the member cannot
//     serve now (out of sessions; its slot vanished).
//   - CKR_USER_ANOTHER_ALREADY_LOGGED_IN, CKR_USER_PIN_NOT_INITIALIZED,
//     CKR_USER_TOO_MANY_TYPES are login: the login state of the token, not
//     its health, and retrying elsewhere would hide a misconfiguration.
var codeClass = map[uint]Class{
	pkcs11.CKR_OK: ClassNone,

	// Member health.
	pkcs11.CKR_HOST_MEMORY:              ClassHealth,
	pkcs11.CKR_SLOT_ID_INVALID:          ClassHealth,
	pkcs11.CKR_GENERAL_ERROR:            ClassHealth,
	pkcs11.CKR_FUNCTION_FAILED:          ClassHealth,
	pkcs11.CKR_NEED_TO_CREATE_THREADS:   ClassHealth,
	pkcs11.CKR_CANT_LOCK:                ClassHealth,
	pkcs11.CKR_DEVICE_ERROR:             ClassHealth,
	pkcs11.CKR_DEVICE_MEMORY:            ClassHealth,
	pkcs11.CKR_DEVICE_REMOVED:           ClassHealth,
	pkcs11.CKR_FUNCTION_CANCELED:        ClassHealth,
	pkcs11.CKR_SESSION_CLOSED:           ClassHealth,
	pkcs11.CKR_SESSION_COUNT:            ClassHealth,
	pkcs11.CKR_SESSION_HANDLE_INVALID:   ClassHealth,
	pkcs11.CKR_TOKEN_NOT_PRESENT:        ClassHealth,
	pkcs11.CKR_TOKEN_NOT_RECOGNIZED:     ClassHealth,
	pkcs11.CKR_CRYPTOKI_NOT_INITIALIZED: ClassHealth,
	pkcs11.CKR_MUTEX_BAD:                ClassHealth,
	pkcs11.CKR_MUTEX_NOT_LOCKED:         ClassHealth,
	pkcs11.CKR_FIPS_SELF_TEST_FAILED:    ClassHealth,
	pkcs11.CKR_LIBRARY_LOAD_FAILED:      ClassHealth,
	pkcs11.CKR_VENDOR_DEFINED:           ClassHealth,

	// Login.
	pkcs11.CKR_PIN_INCORRECT:                  ClassLogin,
	pkcs11.CKR_PIN_INVALID:                    ClassLogin,
	pkcs11.CKR_PIN_LEN_RANGE:                  ClassLogin,
	pkcs11.CKR_PIN_EXPIRED:                    ClassLogin,
	pkcs11.CKR_PIN_LOCKED:                     ClassLogin,
	pkcs11.CKR_USER_PIN_NOT_INITIALIZED:       ClassLogin,
	pkcs11.CKR_USER_ANOTHER_ALREADY_LOGGED_IN: ClassLogin,
	pkcs11.CKR_USER_TOO_MANY_TYPES:            ClassLogin,
	pkcs11.CKR_NEW_PIN_MODE:                   ClassLogin,
	pkcs11.CKR_NEXT_OTP:                       ClassLogin,

	// Request.
	pkcs11.CKR_CANCEL:                           ClassRequest,
	pkcs11.CKR_ARGUMENTS_BAD:                    ClassRequest,
	pkcs11.CKR_NO_EVENT:                         ClassRequest,
	pkcs11.CKR_ATTRIBUTE_READ_ONLY:              ClassRequest,
	pkcs11.CKR_ATTRIBUTE_SENSITIVE:              ClassRequest,
	pkcs11.CKR_ATTRIBUTE_TYPE_INVALID:           ClassRequest,
	pkcs11.CKR_ATTRIBUTE_VALUE_INVALID:          ClassRequest,
	pkcs11.CKR_ACTION_PROHIBITED:                ClassRequest,
	pkcs11.CKR_DATA_INVALID:                     ClassRequest,
	pkcs11.CKR_DATA_LEN_RANGE:                   ClassRequest,
	pkcs11.CKR_ENCRYPTED_DATA_INVALID:           ClassRequest,
	pkcs11.CKR_ENCRYPTED_DATA_LEN_RANGE:         ClassRequest,
	pkcs11.CKR_FUNCTION_NOT_PARALLEL:            ClassRequest,
	pkcs11.CKR_FUNCTION_NOT_SUPPORTED:           ClassRequest,
	pkcs11.CKR_KEY_HANDLE_INVALID:               ClassRequest,
	pkcs11.CKR_KEY_SIZE_RANGE:                   ClassRequest,
	pkcs11.CKR_KEY_TYPE_INCONSISTENT:            ClassRequest,
	pkcs11.CKR_KEY_NOT_NEEDED:                   ClassRequest,
	pkcs11.CKR_KEY_CHANGED:                      ClassRequest,
	pkcs11.CKR_KEY_NEEDED:                       ClassRequest,
	pkcs11.CKR_KEY_INDIGESTIBLE:                 ClassRequest,
	pkcs11.CKR_KEY_FUNCTION_NOT_PERMITTED:       ClassRequest,
	pkcs11.CKR_KEY_NOT_WRAPPABLE:                ClassRequest,
	pkcs11.CKR_KEY_UNEXTRACTABLE:                ClassRequest,
	pkcs11.CKR_MECHANISM_INVALID:                ClassRequest,
	pkcs11.CKR_MECHANISM_PARAM_INVALID:          ClassRequest,
	pkcs11.CKR_OBJECT_HANDLE_INVALID:            ClassRequest,
	pkcs11.CKR_OPERATION_ACTIVE:                 ClassRequest,
	pkcs11.CKR_OPERATION_NOT_INITIALIZED:        ClassRequest,
	pkcs11.CKR_SESSION_PARALLEL_NOT_SUPPORTED:   ClassRequest,
	pkcs11.CKR_SESSION_READ_ONLY:                ClassRequest,
	pkcs11.CKR_SESSION_EXISTS:                   ClassRequest,
	pkcs11.CKR_SESSION_READ_ONLY_EXISTS:         ClassRequest,
	pkcs11.CKR_SESSION_READ_WRITE_SO_EXISTS:     ClassRequest,
	pkcs11.CKR_SIGNATURE_INVALID:                ClassRequest,
	pkcs11.CKR_SIGNATURE_LEN_RANGE:              ClassRequest,
	pkcs11.CKR_TEMPLATE_INCOMPLETE:              ClassRequest,
	pkcs11.CKR_TEMPLATE_INCONSISTENT:            ClassRequest,
	pkcs11.CKR_TOKEN_WRITE_PROTECTED:            ClassRequest,
	pkcs11.CKR_UNWRAPPING_KEY_HANDLE_INVALID:    ClassRequest,
	pkcs11.CKR_UNWRAPPING_KEY_SIZE_RANGE:        ClassRequest,
	pkcs11.CKR_UNWRAPPING_KEY_TYPE_INCONSISTENT: ClassRequest,
	pkcs11.CKR_USER_ALREADY_LOGGED_IN:           ClassRequest,
	pkcs11.CKR_USER_NOT_LOGGED_IN:               ClassRequest,
	pkcs11.CKR_USER_TYPE_INVALID:                ClassRequest,
	pkcs11.CKR_WRAPPED_KEY_INVALID:              ClassRequest,
	pkcs11.CKR_WRAPPED_KEY_LEN_RANGE:            ClassRequest,
	pkcs11.CKR_WRAPPING_KEY_HANDLE_INVALID:      ClassRequest,
	pkcs11.CKR_WRAPPING_KEY_SIZE_RANGE:          ClassRequest,
	pkcs11.CKR_WRAPPING_KEY_TYPE_INCONSISTENT:   ClassRequest,
	pkcs11.CKR_RANDOM_SEED_NOT_SUPPORTED:        ClassRequest,
	pkcs11.CKR_RANDOM_NO_RNG:                    ClassRequest,
	pkcs11.CKR_DOMAIN_PARAMS_INVALID:            ClassRequest,
	pkcs11.CKR_CURVE_NOT_SUPPORTED:              ClassRequest,
	pkcs11.CKR_BUFFER_TOO_SMALL:                 ClassRequest,
	pkcs11.CKR_SAVED_STATE_INVALID:              ClassRequest,
	pkcs11.CKR_INFORMATION_SENSITIVE:            ClassRequest,
	pkcs11.CKR_STATE_UNSAVEABLE:                 ClassRequest,
	pkcs11.CKR_CRYPTOKI_ALREADY_INITIALIZED:     ClassRequest,
	pkcs11.CKR_EXCEEDED_MAX_ITERATIONS:          ClassRequest,
	pkcs11.CKR_PIN_TOO_WEAK:                     ClassRequest,
	pkcs11.CKR_PUBLIC_KEY_INVALID:               ClassRequest,
	pkcs11.CKR_FUNCTION_REJECTED:                ClassRequest,
}

// ClassOfCode classifies a CKR code. Codes unknown to PKCS#11 (vendor
// codes) are health errors.
func ClassOfCode(code uint) Class {
	if c, ok := codeClass[code]; ok {
		return c
	}
	return ClassHealth
}

// ClassOf classifies err (nil → ClassNone; unknown errors → ClassHealth).
// A context cancelled or past its deadline while the caller waited is the
// caller's decision, not the member's fault: ClassRequest.
func ClassOf(err error) Class {
	if err == nil {
		return ClassNone
	}
	if errors.Is(err, ErrTimeout) {
		return ClassHealth
	}
	if se := (*Error)(nil); errors.As(err, &se) && se.requestAnswer {
		return ClassRequest
	}
	if code, ok := codeIn(err); ok {
		return ClassOfCode(code)
	}
	switch {
	case errors.Is(err, ErrInvalidSpec), errors.Is(err, ErrOvertaken):
		return ClassRequest
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ClassRequest
	}
	return ClassHealth
}

// PINRefused reports whether err is a token refusing a PIN itself:
// incorrect (or of a length or form it does not take), locked or expired.
// Offering the same PIN again can only bring a lockout closer, so nothing
// offers it again by itself.
func PINRefused(err error) bool {
	code, ok := codeIn(err)
	if !ok {
		return false
	}
	switch code {
	case pkcs11.CKR_PIN_INCORRECT, pkcs11.CKR_PIN_INVALID, pkcs11.CKR_PIN_LEN_RANGE,
		pkcs11.CKR_PIN_LOCKED, pkcs11.CKR_PIN_EXPIRED:
		return true
	}
	return false
}

// CodeOf returns the CKR code for err for the C boundary: the module's own
// code, CKR_DEVICE_ERROR for timeouts and unknown health errors, CKR_OK for nil.
func CodeOf(err error) uint {
	if err == nil {
		return pkcs11.CKR_OK
	}
	if errors.Is(err, ErrTimeout) {
		return pkcs11.CKR_DEVICE_ERROR
	}
	if code, ok := codeIn(err); ok {
		return code
	}
	switch {
	case errors.Is(err, ErrTokenNotFound):
		return pkcs11.CKR_TOKEN_NOT_PRESENT
	case errors.Is(err, ErrInvalidSpec):
		return pkcs11.CKR_ARGUMENTS_BAD
	case errors.Is(err, context.Canceled):
		return pkcs11.CKR_FUNCTION_CANCELED
	}
	return pkcs11.CKR_DEVICE_ERROR
}

// codeIn finds the CKR code carried by err: an *Error's Code or a
// pkcs11.Error in the chain.
func codeIn(err error) (uint, bool) {
	var se *Error
	if errors.As(err, &se) && se.Code != 0 {
		return se.Code, true
	}
	var pe pkcs11.Error
	if errors.As(err, &pe) {
		return uint(pe), true
	}
	return 0, false
}

// newError wraps the raw error of op on member. A pkcs11.Error gives the
// code; anything else is kept as it is.
func newError(member string, op Op, err error) error {
	if err == nil {
		return nil
	}
	if se, ok := err.(*Error); ok {
		return se
	}
	e := &Error{Member: member, Op: op, Err: err}
	var pe pkcs11.Error
	if errors.As(err, &pe) {
		e.Code = uint(pe)
	}
	return e
}

// errorOf is newError for a call of s's module: a code that s's make
// answers to a request it cannot serve is classed as the request's.
func (s *Slot) errorOf(op Op, err error) error {
	err = newError(s.spec.Name, op, err)
	if se, ok := err.(*Error); ok && se.Code == pkcs11.CKR_HOST_MEMORY {
		t := s.Token()
		se.requestAnswer = tokenquirk.HostMemoryIsRequestError(t.Manufacturer, t.Model)
	}
	return err
}

// timeoutError is the error of a call that outlived its deadline d.
func timeoutError(member string, op Op, d time.Duration) error {
	return &Error{Member: member, Op: op, Err: fmt.Errorf("%w (%v)", ErrTimeout, d)}
}

// invalid returns a request-class error naming what is wrong.
func invalid(member string, op Op, format string, args ...any) error {
	return &Error{Member: member, Op: op, Err: fmt.Errorf("%w: %s", ErrInvalidSpec, fmt.Sprintf(format, args...))}
}

// isSessionFatal reports whether a session that returned err must be
// discarded rather than reused: every health error, and an operation left
// active on it.
func isSessionFatal(err error) bool {
	if err == nil {
		return false
	}
	if code, ok := codeIn(err); ok && code == pkcs11.CKR_OPERATION_ACTIVE {
		return true
	}
	return ClassOf(err) == ClassHealth
}

// Ambiguous reports whether a health-class error may as well be the
// request's or a passing moment's fault: CKR_GENERAL_ERROR and
// CKR_FUNCTION_FAILED, which tokens also return for requests they dislike,
// and SoftHSM for a C_GetTokenInfo that meets another process's C_Login
// rewriting the token file. The engine fails a member for one only once it
// is confirmed: another member served the same request, or the same probe
// failed so again.
func Ambiguous(err error) bool {
	if errors.Is(err, ErrTimeout) {
		return false
	}
	switch CodeOf(err) {
	case pkcs11.CKR_GENERAL_ERROR, pkcs11.CKR_FUNCTION_FAILED:
		return true
	}
	return false
}

// StaleHandle reports whether err says a handle named in the call is not
// (or no longer) valid on the member: looked up again, never charged.
func StaleHandle(err error) bool {
	switch CodeOf(err) {
	case pkcs11.CKR_OBJECT_HANDLE_INVALID, pkcs11.CKR_KEY_HANDLE_INVALID,
		pkcs11.CKR_WRAPPING_KEY_HANDLE_INVALID, pkcs11.CKR_UNWRAPPING_KEY_HANDLE_INVALID:
		return true
	}
	return false
}
