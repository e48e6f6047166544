// Package slot is one physical PKCS#11 token: module loading with one shared,
// reference-counted context per module, token lookup by label, serial or
// RFC 7512 URI, a bounded pool of sessions behind one long-lived logged-in
// session, a deadline on every module call, and the classification of every
// CKR code into member health, login and request errors.
//
// # Modules
//
// A module path is the absolute path of a PKCS#11 library, loaded in this
// process through miekg/pkcs11, or a token served by another process
// (cmd/hsmserve), named hagroup-remote:unix:/path/of/socket (see
// pkg/remote); such a path gets a module context of its own per Slot.
//
// # Deadlines and dispatch
//
// A call into a module cannot be cancelled. Under Spec.Dispatch
// dispatch.Handoff (the default) every call therefore runs on the worker of
// its session while the caller waits for the result, for
// Spec.CommandTimeout (Spec.KeygenTimeout for key generation), or for its
// ctx, whichever comes first. A caller that stops waiting gets an error
// wrapping ErrTimeout (or its ctx's error) and the session is quarantined:
// it is never used again, and it is closed if the call ever returns. Under
// dispatch.Inline the call runs on the caller's goroutine and is never
// abandoned; once one is past its deadline every other call fails with
// ErrTimeout until it returns.
//
// SoftHSM tokens get an object lock (internal/tokenquirk) that keeps this
// process's object writes apart from its object reads; the time a call
// waits for it is added to its deadline.
//
// # Handles and logins
//
// SoftHSM, like many tokens, invalidates private object handles on logout. A
// Slot holding a user PIN logs in again by itself when it finds its login
// gone (a new anchor session, Reinit, a lost login) — until the token
// refuses that PIN (PINRefused): then it forgets it, so a PIN changed on
// the HSM is not offered again and again until the user is locked out —
// and Epoch changes whenever handles obtained earlier may have become
// invalid (re-login, Logout, Reinit): callers that cache handles compare
// Epoch and look their objects up again.
//
// # Errors
//
// Errors of module calls are *Error values naming the member and the
// operation and wrapping the original pkcs11.Error; errors.Is matches them
// against the sentinels (ErrDeviceFailure, ErrSessionLost, ErrPINIncorrect,
// …) and ClassOf says whom to charge: the member's health, its login, or the
// request.
package slot
