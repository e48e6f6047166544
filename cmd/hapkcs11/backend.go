package main

import (
	"context"

	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// The C layer (abi.go, library.go) sees every slot it lists through these
// two interfaces and nothing else: a virtual HA slot (engine.go, on
// pkg/group) and a physical member slot (physical.go, on pkg/slot) look the
// same to it. Object handles are whatever the backend hands out (virtual
// handles for a group, the member's own handles for a physical slot); they
// mean something only within their slot. Errors carry their CKR code as
// slot.CodeOf reads it.

// token is one slot the module lists, with its token.
type token interface {
	// SlotInfo describes the slot; it does not block.
	SlotInfo() slotInfo
	// TokenInfo describes the token as the backend sees it now.
	TokenInfo(ctx context.Context) (pkcs11.TokenInfo, error)
	Mechanisms(ctx context.Context) ([]uint, error)
	// Withholds reports whether an Init of a mechanism Mechanisms leaves
	// out is refused by the slot itself (CKR_MECHANISM_INVALID) rather
	// than answered by the token (pkg/group's Withholds).
	Withholds(ctx context.Context, mech uint) (bool, error)
	MechanismInfo(ctx context.Context, mech uint) (pkcs11.MechanismInfo, error)
	// Login logs userType in for the whole token (every session of the
	// application), as C_Login does.
	Login(ctx context.Context, userType uint, pin secret.PIN) error
	Logout(ctx context.Context) error
	// LoggedIn reports whether the application is logged in to the token,
	// and as whom: the token's (for a group, the engine's) login state,
	// which the library does not keep.
	LoggedIn() (userType uint, ok bool)
	// OpenSession opens one application session.
	OpenSession(ctx context.Context) (session, error)
	// Close releases the token when the module is finalized.
	Close() error
}

// slotInfo is what C_GetSlotInfo reports, minus the versions.
type slotInfo struct {
	Description  string
	Manufacturer string
	Present      bool // a token is in the slot (a physical member is reachable)
	Hardware     bool
}

// session is one application session on a token, with the handles the
// application sees. The library calls it from one goroutine at a time (it
// serialises calls per session, as PKCS#11 sessions are single-threaded).
type session interface {
	FindObjects(ctx context.Context, tmpl []*pkcs11.Attribute) ([]uint, error)
	objectCalls[uint]
	opCalls[uint]

	// Check returns an error when the backend lost the session (a group's
	// session when every member failed in activeBasic).
	Check() error
}

// objectCalls is what a session does to objects, with handles H: the
// application's (uint) or an engine's session's (see handleSession).
type objectCalls[H ~uint] interface {
	GetAttributes(ctx context.Context, h H, types []uint) ([]slot.Attribute, error)
	SetAttributes(ctx context.Context, h H, attrs []*pkcs11.Attribute) error
	CreateObject(ctx context.Context, tmpl []*pkcs11.Attribute) (H, error)
	CopyObject(ctx context.Context, h H, tmpl []*pkcs11.Attribute) (H, error)
	DestroyObject(ctx context.Context, h H) error
	GenerateKey(ctx context.Context, m *pkcs11.Mechanism, tmpl []*pkcs11.Attribute) (H, error)
	GenerateKeyPair(ctx context.Context, m *pkcs11.Mechanism, pub, priv []*pkcs11.Attribute) (H, H, error)
	WrapKey(ctx context.Context, m *pkcs11.Mechanism, wrapping, key H) ([]byte, error)
	UnwrapKey(ctx context.Context, m *pkcs11.Mechanism, unwrapping H, blob []byte, tmpl []*pkcs11.Attribute) (H, error)
	DeriveKey(ctx context.Context, m *pkcs11.Mechanism, base H, tmpl []*pkcs11.Attribute) (H, error)
	GenerateRandom(ctx context.Context, n int) ([]byte, error)
}

// opCalls are the cryptographic operations (C_SignInit … C_SignFinal),
// which run through pkg/group's one operation state machine for both kinds
// of slot: it keeps the active operations, what ends them and output held
// for the buffer convention (see group.Session.Do).
type opCalls[H ~uint] interface {
	Init(ctx context.Context, k group.OpKind, m *pkcs11.Mechanism, key H) error
	Cancel(k group.OpKind) error
	// Active reports whether an operation is active (one per session, as
	// on the member token; a search is the library's).
	Active() bool
	// Do runs one step of an operation (group.Session.Do); a lost session
	// answers CKR_SESSION_HANDLE_INVALID.
	Do(ctx context.Context, k group.OpKind, st group.Step, in, sig []byte, room group.Room) ([]byte, error)
	DigestKey(ctx context.Context, key H) error
	// Close ends the session (and its session objects).
	Close() error
}
