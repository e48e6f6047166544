// Package remote serves a PKCS#11 token to hagroup from another process:
// the server (Server, run by cmd/hsmserve) holds the real module, and the
// client (Client, used by pkg/slot) stands in for a module in the member's
// process. A member served this way can die (SIGKILL), hang (SIGSTOP) or
// be restarted on its own, like a network HSM, and still receive keys
// replicated under the group's domain key.
//
// # Module path
//
// A served token is named by a module path of the form
//
//	hagroup-remote:unix:/absolute/path/of/the.sock
//
// wherever a PKCS#11 module path goes (slot.Spec.Module, module = … in
// hagroup.toml). ModulePath builds it, ParseModulePath checks it. Each
// slot.Open of such a path gets a module context, and a connection, of its
// own (Slot.OwnsContext is true), and Slot.Reinit connects again.
//
// # Why not p11-kit
//
// `p11-kit server` (0.24) serves a token too, but its RPC carries neither
// CKM_AES_KEY_WRAP_PAD (its client hides every mechanism whose parameters
// it cannot marshal) nor attribute arrays (CKA_UNWRAP_TEMPLATE), which is
// how hagroup replicates keys. This transport carries mechanism parameters
// as their bytes (pkcs11.Mechanism.Parameter), and the parameters that
// hold pointers (OAEP, GCM, ECDH1) as the values they point at; it carries
// attributes, nested attribute arrays, and CKR codes as pkcs11.Error.
//
// # Protocol
//
// Version ProtocolVersion: a stream of encoding/gob values on one Unix
// stream connection per client context: hello and welcome (the server
// refuses other versions, naming both), then requests tagged with an ID
// and responses carrying it back. The server runs requests concurrently,
// so every call of a context shares the connection without waiting for
// the others; each connection has its own sessions, which the server
// closes when the connection ends.
//
// # Failures
//
// A lost connection (the server died) makes every pending and later call
// of the context fail at once with CKR_DEVICE_ERROR, a health error for
// pkg/slot, until the context is finalized and initialised again (Reinit),
// as a lost p11-kit connection does. A server that stops answering makes
// calls wait; pkg/slot's deadline (Spec.CommandTimeout) bounds them.
//
// # Security
//
// The socket is created with mode 0600 (Listen) and the server accepts
// only peers (SO_PEERCRED) of its own uid or root, unless
// Server.AllowUID says otherwise. PINs cross the socket on C_Login and are
// never logged by either side.
package remote
