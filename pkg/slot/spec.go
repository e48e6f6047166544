package slot

import (
	"context"
	"time"

	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot/dispatch"
)

// Op names a PKCS#11 operation, for errors and for interceptors.
type Op string

// Operation names (one per Slot/Session method that reaches the module).
const (
	OpOpenSession     Op = "OpenSession"
	OpLogin           Op = "Login"
	OpSessionInfo     Op = "SessionInfo" // C_GetSessionInfo: is the login still there?
	OpLogout          Op = "Logout"
	OpTokenInfo       Op = "TokenInfo"
	OpMechanisms      Op = "Mechanisms"
	OpMechanismInfo   Op = "MechanismInfo"
	OpFindObjects     Op = "FindObjects"
	OpGetAttributes   Op = "GetAttributes"
	OpSetAttributes   Op = "SetAttributes"
	OpCreateObject    Op = "CreateObject"
	OpCopyObject      Op = "CopyObject"
	OpDestroyObject   Op = "DestroyObject"
	OpGenerateKey     Op = "GenerateKey"
	OpGenerateKeyPair Op = "GenerateKeyPair"
	OpWrapKey         Op = "WrapKey"
	OpUnwrapKey       Op = "UnwrapKey"
	OpDeriveKey       Op = "DeriveKey"
	OpSign            Op = "Sign"
	OpVerify          Op = "Verify"
	OpEncrypt         Op = "Encrypt"
	OpDecrypt         Op = "Decrypt"
	OpDigest          Op = "Digest"
	OpGenerateRandom  Op = "GenerateRandom"
	OpSignInit        Op = "SignInit"
	OpSignUpdate      Op = "SignUpdate"
	OpSignFinal       Op = "SignFinal"
	OpVerifyInit      Op = "VerifyInit"
	OpVerifyUpdate    Op = "VerifyUpdate"
	OpVerifyFinal     Op = "VerifyFinal"
	OpEncryptInit     Op = "EncryptInit"
	OpEncryptUpdate   Op = "EncryptUpdate"
	OpEncryptFinal    Op = "EncryptFinal"
	OpDecryptInit     Op = "DecryptInit"
	OpDecryptUpdate   Op = "DecryptUpdate"
	OpDecryptFinal    Op = "DecryptFinal"
	OpDigestInit      Op = "DigestInit"
	OpDigestUpdate    Op = "DigestUpdate"
	OpDigestKey       Op = "DigestKey"
	OpDigestFinal     Op = "DigestFinal"
)

// Interceptor sees every operation just before it reaches the module, on
// the goroutine that will make the module call (so a blocking interceptor
// behaves exactly like a hung module: the caller gets ErrTimeout after the
// deadline). A non-nil error (normally a pkcs11.Error) replaces the call's
// result. Used by slottest for fault injection; nil in production.
type Interceptor interface {
	Before(ctx context.Context, token string, op Op) error
}

// MinInitializeTimeout is the least a member module's C_Initialize is
// given, whatever the command timeout. C_Initialize is not a command: a
// network HSM's client connects and authenticates in it, which takes
// seconds, and a command_timeout set small to abandon hung calls fast
// must not make such a member impossible to open.
const MinInitializeTimeout = 5 * time.Second

// initializeTimeout bounds a module's C_Initialize for a member whose
// calls are bounded by cmd.
func initializeTimeout(cmd time.Duration) time.Duration {
	return max(cmd, MinInitializeTimeout)
}

// maxPool caps the session pool when neither the Spec nor the token sets a
// smaller number.
const maxPool = 32

// WrapInterceptor is implemented by an Interceptor that wants to run
// around the module call rather than just before it (slottest uses it to
// bound how many calls run at once). When the Interceptor implements it, the
// slot calls Wrap instead of Before, on the call goroutine; Wrap must call
// call at most once, and return its error or an error of its own.
type WrapInterceptor interface {
	Interceptor
	Wrap(ctx context.Context, token string, op Op, call func() error) error
}

// intercepted runs fn through the spec's interceptor.
func (sp *Spec) intercepted(ctx context.Context, op Op, fn func() error) error {
	switch ic := sp.Interceptor.(type) {
	case nil:
		return fn()
	case WrapInterceptor:
		return ic.Wrap(ctx, sp.Name, op, fn)
	default:
		if err := ic.Before(ctx, sp.Name, op); err != nil {
			return err
		}
		return fn()
	}
}

// Spec says which token to open and how. Open keeps its own copy of the PIN;
// the caller may Zero its own.
type Spec struct {
	Name           string            // member name, used in every error
	Module         string            // path of the PKCS#11 module
	ModuleEnv      map[string]string // set while loading; a non-empty env gives the spec its own context
	InitArgs       string            // pReserved of C_Initialize (ModuleRef.InitArgs); never a PIN
	TokenLabel     string            // exactly one of TokenLabel, TokenSerial, URI
	TokenSerial    string
	URI            string        // RFC 7512 pkcs11: URI
	PIN            secret.PIN    // user PIN; empty: Open does not log in
	CommandTimeout time.Duration // deadline of every call (default 20s)
	KeygenTimeout  time.Duration // deadline of key generation (default 120s)
	MaxSessions    int           // pool cap; 0: min(token MaxRwSessionCount-1, 32), 32 when the token says "effectively infinite"
	ServerUID      *uint32       // served token (hagroup-remote:): the uid its hsmserve must run as, besides root; nil: this process's
	Interceptor    Interceptor   // fault injection for tests
	// Dispatch is how calls reach the module (dispatch.go); "" is
	// dispatch.Handoff.
	Dispatch dispatch.Dispatch
	// ThreadCallers says the calls come from C threads (libhapkcs11.so's
	// application), whose goroutines are locked to them: under handoff
	// such a caller waits in C for a call made in Go as for any other,
	// since parking a locked goroutine costs its thread more than a futex
	// does. Otherwise (goroutines) it parks on a handoff.GoCell.
	ThreadCallers bool
	// StoreLock is the path of a lock file that every process of this
	// host opening the token takes around a change of its object list and
	// the read of that list which comes first (tokenquirk: Hold.RereadFirst),
	// so that no other process's change falls between the two and is
	// hidden from this one; made mode 0660. Empty: none (a served token's
	// server keeps one of its own).
	StoreLock string
}

// Attribute is one attribute read from an object. Status is CKR_OK,
// CKR_ATTRIBUTE_SENSITIVE or CKR_ATTRIBUTE_TYPE_INVALID; Value is nil unless
// Status is CKR_OK.
type Attribute struct {
	Type   uint
	Value  []byte
	Status uint
}

// TokenSummary describes a token a module offers, for `hactl slot list`.
type TokenSummary struct {
	SlotID       uint
	Label        string
	Serial       string
	Manufacturer string
	Model        string
	Firmware     string // CK_TOKEN_INFO's firmwareVersion, "major.minor"
	Hardware     string // its hardwareVersion
	Flags        uint
	Initialized  bool
}

// moduleRef is the module of the spec and how it is loaded.
func (sp *Spec) moduleRef() ModuleRef {
	return ModuleRef{Path: sp.Module, Env: sp.ModuleEnv, InitArgs: sp.InitArgs, ServerUID: sp.ServerUID}
}
