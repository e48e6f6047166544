package slot_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

const (
	health  = slot.ClassHealth
	login   = slot.ClassLogin
	request = slot.ClassRequest
)

// classTable is every CKR code miekg/pkcs11 defines, with the class the
// engine must give it.
var classTable = []struct {
	name  string
	code  uint
	class slot.Class
}{
	{"CKR_CANCEL", pkcs11.CKR_CANCEL, request},
	{"CKR_HOST_MEMORY", pkcs11.CKR_HOST_MEMORY, health},
	{"CKR_SLOT_ID_INVALID", pkcs11.CKR_SLOT_ID_INVALID, health},
	{"CKR_GENERAL_ERROR", pkcs11.CKR_GENERAL_ERROR, health},
	{"CKR_FUNCTION_FAILED", pkcs11.CKR_FUNCTION_FAILED, health},
	{"CKR_ARGUMENTS_BAD", pkcs11.CKR_ARGUMENTS_BAD, request},
	{"CKR_NO_EVENT", pkcs11.CKR_NO_EVENT, request},
	{"CKR_NEED_TO_CREATE_THREADS", pkcs11.CKR_NEED_TO_CREATE_THREADS, health},
	{"CKR_CANT_LOCK", pkcs11.CKR_CANT_LOCK, health},
	{"CKR_ATTRIBUTE_READ_ONLY", pkcs11.CKR_ATTRIBUTE_READ_ONLY, request},
	{"CKR_ATTRIBUTE_SENSITIVE", pkcs11.CKR_ATTRIBUTE_SENSITIVE, request},
	{"CKR_ATTRIBUTE_TYPE_INVALID", pkcs11.CKR_ATTRIBUTE_TYPE_INVALID, request},
	{"CKR_ATTRIBUTE_VALUE_INVALID", pkcs11.CKR_ATTRIBUTE_VALUE_INVALID, request},
	{"CKR_ACTION_PROHIBITED", pkcs11.CKR_ACTION_PROHIBITED, request},
	{"CKR_DATA_INVALID", pkcs11.CKR_DATA_INVALID, request},
	{"CKR_DATA_LEN_RANGE", pkcs11.CKR_DATA_LEN_RANGE, request},
	{"CKR_DEVICE_ERROR", pkcs11.CKR_DEVICE_ERROR, health},
	{"CKR_DEVICE_MEMORY", pkcs11.CKR_DEVICE_MEMORY, health},
	{"CKR_DEVICE_REMOVED", pkcs11.CKR_DEVICE_REMOVED, health},
	{"CKR_ENCRYPTED_DATA_INVALID", pkcs11.CKR_ENCRYPTED_DATA_INVALID, request},
	{"CKR_ENCRYPTED_DATA_LEN_RANGE", pkcs11.CKR_ENCRYPTED_DATA_LEN_RANGE, request},
	{"CKR_FUNCTION_CANCELED", pkcs11.CKR_FUNCTION_CANCELED, health},
	{"CKR_FUNCTION_NOT_PARALLEL", pkcs11.CKR_FUNCTION_NOT_PARALLEL, request},
	{"CKR_FUNCTION_NOT_SUPPORTED", pkcs11.CKR_FUNCTION_NOT_SUPPORTED, request},
	{"CKR_KEY_HANDLE_INVALID", pkcs11.CKR_KEY_HANDLE_INVALID, request},
	{"CKR_KEY_SIZE_RANGE", pkcs11.CKR_KEY_SIZE_RANGE, request},
	{"CKR_KEY_TYPE_INCONSISTENT", pkcs11.CKR_KEY_TYPE_INCONSISTENT, request},
	{"CKR_KEY_NOT_NEEDED", pkcs11.CKR_KEY_NOT_NEEDED, request},
	{"CKR_KEY_CHANGED", pkcs11.CKR_KEY_CHANGED, request},
	{"CKR_KEY_NEEDED", pkcs11.CKR_KEY_NEEDED, request},
	{"CKR_KEY_INDIGESTIBLE", pkcs11.CKR_KEY_INDIGESTIBLE, request},
	{"CKR_KEY_FUNCTION_NOT_PERMITTED", pkcs11.CKR_KEY_FUNCTION_NOT_PERMITTED, request},
	{"CKR_KEY_NOT_WRAPPABLE", pkcs11.CKR_KEY_NOT_WRAPPABLE, request},
	{"CKR_KEY_UNEXTRACTABLE", pkcs11.CKR_KEY_UNEXTRACTABLE, request},
	{"CKR_MECHANISM_INVALID", pkcs11.CKR_MECHANISM_INVALID, request},
	{"CKR_MECHANISM_PARAM_INVALID", pkcs11.CKR_MECHANISM_PARAM_INVALID, request},
	{"CKR_OBJECT_HANDLE_INVALID", pkcs11.CKR_OBJECT_HANDLE_INVALID, request},
	{"CKR_OPERATION_ACTIVE", pkcs11.CKR_OPERATION_ACTIVE, request},
	{"CKR_OPERATION_NOT_INITIALIZED", pkcs11.CKR_OPERATION_NOT_INITIALIZED, request},
	{"CKR_PIN_INCORRECT", pkcs11.CKR_PIN_INCORRECT, login},
	{"CKR_PIN_INVALID", pkcs11.CKR_PIN_INVALID, login},
	{"CKR_PIN_LEN_RANGE", pkcs11.CKR_PIN_LEN_RANGE, login},
	{"CKR_PIN_EXPIRED", pkcs11.CKR_PIN_EXPIRED, login},
	{"CKR_PIN_LOCKED", pkcs11.CKR_PIN_LOCKED, login},
	{"CKR_SESSION_CLOSED", pkcs11.CKR_SESSION_CLOSED, health},
	{"CKR_SESSION_COUNT", pkcs11.CKR_SESSION_COUNT, health},
	{"CKR_SESSION_HANDLE_INVALID", pkcs11.CKR_SESSION_HANDLE_INVALID, health},
	{"CKR_SESSION_PARALLEL_NOT_SUPPORTED", pkcs11.CKR_SESSION_PARALLEL_NOT_SUPPORTED, request},
	{"CKR_SESSION_READ_ONLY", pkcs11.CKR_SESSION_READ_ONLY, request},
	{"CKR_SESSION_EXISTS", pkcs11.CKR_SESSION_EXISTS, request},
	{"CKR_SESSION_READ_ONLY_EXISTS", pkcs11.CKR_SESSION_READ_ONLY_EXISTS, request},
	{"CKR_SESSION_READ_WRITE_SO_EXISTS", pkcs11.CKR_SESSION_READ_WRITE_SO_EXISTS, request},
	{"CKR_SIGNATURE_INVALID", pkcs11.CKR_SIGNATURE_INVALID, request},
	{"CKR_SIGNATURE_LEN_RANGE", pkcs11.CKR_SIGNATURE_LEN_RANGE, request},
	{"CKR_TEMPLATE_INCOMPLETE", pkcs11.CKR_TEMPLATE_INCOMPLETE, request},
	{"CKR_TEMPLATE_INCONSISTENT", pkcs11.CKR_TEMPLATE_INCONSISTENT, request},
	{"CKR_TOKEN_NOT_PRESENT", pkcs11.CKR_TOKEN_NOT_PRESENT, health},
	{"CKR_TOKEN_NOT_RECOGNIZED", pkcs11.CKR_TOKEN_NOT_RECOGNIZED, health},
	{"CKR_TOKEN_WRITE_PROTECTED", pkcs11.CKR_TOKEN_WRITE_PROTECTED, request},
	{"CKR_UNWRAPPING_KEY_HANDLE_INVALID", pkcs11.CKR_UNWRAPPING_KEY_HANDLE_INVALID, request},
	{"CKR_UNWRAPPING_KEY_SIZE_RANGE", pkcs11.CKR_UNWRAPPING_KEY_SIZE_RANGE, request},
	{"CKR_UNWRAPPING_KEY_TYPE_INCONSISTENT", pkcs11.CKR_UNWRAPPING_KEY_TYPE_INCONSISTENT, request},
	{"CKR_USER_ALREADY_LOGGED_IN", pkcs11.CKR_USER_ALREADY_LOGGED_IN, request},
	{"CKR_USER_NOT_LOGGED_IN", pkcs11.CKR_USER_NOT_LOGGED_IN, request},
	{"CKR_USER_PIN_NOT_INITIALIZED", pkcs11.CKR_USER_PIN_NOT_INITIALIZED, login},
	{"CKR_USER_TYPE_INVALID", pkcs11.CKR_USER_TYPE_INVALID, request},
	{"CKR_USER_ANOTHER_ALREADY_LOGGED_IN", pkcs11.CKR_USER_ANOTHER_ALREADY_LOGGED_IN, login},
	{"CKR_USER_TOO_MANY_TYPES", pkcs11.CKR_USER_TOO_MANY_TYPES, login},
	{"CKR_WRAPPED_KEY_INVALID", pkcs11.CKR_WRAPPED_KEY_INVALID, request},
	{"CKR_WRAPPED_KEY_LEN_RANGE", pkcs11.CKR_WRAPPED_KEY_LEN_RANGE, request},
	{"CKR_WRAPPING_KEY_HANDLE_INVALID", pkcs11.CKR_WRAPPING_KEY_HANDLE_INVALID, request},
	{"CKR_WRAPPING_KEY_SIZE_RANGE", pkcs11.CKR_WRAPPING_KEY_SIZE_RANGE, request},
	{"CKR_WRAPPING_KEY_TYPE_INCONSISTENT", pkcs11.CKR_WRAPPING_KEY_TYPE_INCONSISTENT, request},
	{"CKR_RANDOM_SEED_NOT_SUPPORTED", pkcs11.CKR_RANDOM_SEED_NOT_SUPPORTED, request},
	{"CKR_RANDOM_NO_RNG", pkcs11.CKR_RANDOM_NO_RNG, request},
	{"CKR_DOMAIN_PARAMS_INVALID", pkcs11.CKR_DOMAIN_PARAMS_INVALID, request},
	{"CKR_CURVE_NOT_SUPPORTED", pkcs11.CKR_CURVE_NOT_SUPPORTED, request},
	{"CKR_BUFFER_TOO_SMALL", pkcs11.CKR_BUFFER_TOO_SMALL, request},
	{"CKR_SAVED_STATE_INVALID", pkcs11.CKR_SAVED_STATE_INVALID, request},
	{"CKR_INFORMATION_SENSITIVE", pkcs11.CKR_INFORMATION_SENSITIVE, request},
	{"CKR_STATE_UNSAVEABLE", pkcs11.CKR_STATE_UNSAVEABLE, request},
	{"CKR_CRYPTOKI_NOT_INITIALIZED", pkcs11.CKR_CRYPTOKI_NOT_INITIALIZED, health},
	{"CKR_CRYPTOKI_ALREADY_INITIALIZED", pkcs11.CKR_CRYPTOKI_ALREADY_INITIALIZED, request},
	{"CKR_MUTEX_BAD", pkcs11.CKR_MUTEX_BAD, health},
	{"CKR_MUTEX_NOT_LOCKED", pkcs11.CKR_MUTEX_NOT_LOCKED, health},
	{"CKR_NEW_PIN_MODE", pkcs11.CKR_NEW_PIN_MODE, login},
	{"CKR_NEXT_OTP", pkcs11.CKR_NEXT_OTP, login},
	{"CKR_EXCEEDED_MAX_ITERATIONS", pkcs11.CKR_EXCEEDED_MAX_ITERATIONS, request},
	{"CKR_FIPS_SELF_TEST_FAILED", pkcs11.CKR_FIPS_SELF_TEST_FAILED, health},
	{"CKR_LIBRARY_LOAD_FAILED", pkcs11.CKR_LIBRARY_LOAD_FAILED, health},
	{"CKR_PIN_TOO_WEAK", pkcs11.CKR_PIN_TOO_WEAK, request},
	{"CKR_PUBLIC_KEY_INVALID", pkcs11.CKR_PUBLIC_KEY_INVALID, request},
	{"CKR_FUNCTION_REJECTED", pkcs11.CKR_FUNCTION_REJECTED, request},
	{"CKR_VENDOR_DEFINED", pkcs11.CKR_VENDOR_DEFINED, health},
	{"vendor code", pkcs11.CKR_VENDOR_DEFINED + 0x1234, health},
}

func TestClassification(t *testing.T) {
	t.Parallel()
	for _, c := range classTable {
		t.Run(c.name, func(t *testing.T) {
			raw := pkcs11.Error(c.code)
			wrapped := &slot.Error{Member: "hsm-a", Op: slot.OpSign, Code: c.code, Err: raw}
			for _, err := range []error{raw, wrapped, fmt.Errorf("context: %w", wrapped)} {
				if got := slot.ClassOf(err); got != c.class {
					t.Errorf("ClassOf(%v) = %v, want %v", err, got, c.class)
				}
				if got := slot.CodeOf(err); got != c.code {
					t.Errorf("CodeOf(%v) = %#x, want %#x", err, got, c.code)
				}
			}
			if got := slot.ClassOfCode(c.code); got != c.class {
				t.Errorf("ClassOfCode(%#x) = %v, want %v", c.code, got, c.class)
			}
		})
	}
}

// Every code miekg/pkcs11 has a name for is in the table.
func TestClassificationCoversMiekg(t *testing.T) {
	t.Parallel()
	known := make(map[uint]bool)
	for _, c := range classTable {
		known[c.code] = true
	}
	for code := uint(1); code < 0x400; code++ {
		msg := pkcs11.Error(code).Error()
		if strings.HasSuffix(msg, ": ") {
			continue // miekg has no name for it
		}
		if !known[code] {
			t.Errorf("%s is not in the classification table", msg)
		}
	}
}

func TestClassOfOtherErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		err   error
		class slot.Class
		code  uint
	}{
		{"nil", nil, slot.ClassNone, pkcs11.CKR_OK},
		{"timeout", &slot.Error{Member: "a", Op: slot.OpSign, Err: fmt.Errorf("%w (1s)", slot.ErrTimeout)}, health, pkcs11.CKR_DEVICE_ERROR},
		{"cancelled", &slot.Error{Member: "a", Op: slot.OpSign, Err: context.Canceled}, request, pkcs11.CKR_FUNCTION_CANCELED},
		{"caller deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), request, pkcs11.CKR_DEVICE_ERROR},
		{"token not found", &slot.Error{Member: "a", Err: slot.ErrTokenNotFound}, health, pkcs11.CKR_TOKEN_NOT_PRESENT},
		{"closed", &slot.Error{Member: "a", Err: slot.ErrClosed}, health, pkcs11.CKR_DEVICE_ERROR},
		{"invalid", &slot.Error{Member: "a", Err: slot.ErrInvalidSpec}, request, pkcs11.CKR_ARGUMENTS_BAD},
		{"unknown", errors.New("something odd"), health, pkcs11.CKR_DEVICE_ERROR},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := slot.ClassOf(c.err); got != c.class {
				t.Errorf("ClassOf = %v, want %v", got, c.class)
			}
			if got := slot.CodeOf(c.err); got != c.code {
				t.Errorf("CodeOf = %#x, want %#x", got, c.code)
			}
		})
	}
}

func TestSentinels(t *testing.T) {
	t.Parallel()
	cases := []struct {
		code     uint
		sentinel error
	}{
		{pkcs11.CKR_DEVICE_ERROR, slot.ErrDeviceFailure},
		{pkcs11.CKR_DEVICE_MEMORY, slot.ErrDeviceFailure},
		{pkcs11.CKR_DEVICE_REMOVED, slot.ErrDeviceFailure},
		{pkcs11.CKR_DEVICE_REMOVED, slot.ErrTokenNotPresent},
		{pkcs11.CKR_GENERAL_ERROR, slot.ErrDeviceFailure},
		{pkcs11.CKR_FUNCTION_FAILED, slot.ErrDeviceFailure},
		{pkcs11.CKR_TOKEN_NOT_PRESENT, slot.ErrTokenNotPresent},
		{pkcs11.CKR_TOKEN_NOT_RECOGNIZED, slot.ErrTokenNotPresent},
		{pkcs11.CKR_SLOT_ID_INVALID, slot.ErrTokenNotPresent},
		{pkcs11.CKR_SESSION_HANDLE_INVALID, slot.ErrSessionLost},
		{pkcs11.CKR_SESSION_CLOSED, slot.ErrSessionLost},
		{pkcs11.CKR_CRYPTOKI_NOT_INITIALIZED, slot.ErrNotInitialized},
		{pkcs11.CKR_PIN_INCORRECT, slot.ErrPINIncorrect},
		{pkcs11.CKR_PIN_LOCKED, slot.ErrPINLocked},
		{pkcs11.CKR_PIN_EXPIRED, slot.ErrPINExpired},
	}
	all := []error{slot.ErrDeviceFailure, slot.ErrTokenNotPresent, slot.ErrSessionLost, slot.ErrNotInitialized,
		slot.ErrPINIncorrect, slot.ErrPINLocked, slot.ErrPINExpired, slot.ErrTimeout, slot.ErrTokenNotFound}
	for _, c := range cases {
		err := fmt.Errorf("op: %w", &slot.Error{Member: "a", Op: slot.OpSign, Code: c.code, Err: pkcs11.Error(c.code)})
		if !errors.Is(err, c.sentinel) {
			t.Errorf("%v does not match %v", err, c.sentinel)
		}
		if !errors.Is(err, pkcs11.Error(c.code)) {
			t.Errorf("%v does not match its own pkcs11.Error", err)
		}
	}
	// A request error matches none of them.
	err := &slot.Error{Member: "a", Op: slot.OpSign, Code: pkcs11.CKR_MECHANISM_INVALID, Err: pkcs11.Error(pkcs11.CKR_MECHANISM_INVALID)}
	for _, s := range all {
		if errors.Is(err, s) {
			t.Errorf("CKR_MECHANISM_INVALID matches %v", s)
		}
	}
}
