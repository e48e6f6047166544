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
// hold pointers as their structures and the values they point at, by the
// layouts rpcgen writes from pkcs11t.h (internal/mechparam); it carries
// attributes, nested attribute arrays, and CKR codes as pkcs11.Error.
//
// # Protocol
//
// Version ProtocolVersion: frames on one Unix stream connection per client
// context, each a 4-byte length and at most MaxFrame bytes holding one
// message value by value: hello and welcome (the server refuses other
// versions, naming both), then requests tagged with an ID and responses
// carrying it back. A request carries its call's arguments and a
// successful response its results, each by its type in the signature of
// the miekg/pkcs11 method that serves the function (rpcgen writes which,
// from pkcs11f.h: ops_gen.go), so no function is described twice. The server runs up to 16 requests of a connection
// concurrently, and reads no more while those and the replies not yet
// written hold a frame's worth (back-pressure), so every call of a
// context shares the connection without waiting for the others.
// Whoever reads a frame checks its length and every count in it against
// the bounds (MaxFrame, MaxAttributes, MaxNested, MaxHandles) before it
// allocates; C_GenerateRandom is bounded by MaxRandom. A request over a
// bound fails alone with CKR_ARGUMENTS_BAD.
//
// # Processes
//
// hsmserve serves each connection in a process of its own (Server.Child,
// ServeHanded) with its own module context: the client's login, logout and
// sessions are its own, as with one application per process on a bare
// token. The sessions of a connection end with it. The process is started
// ahead, its module loaded, and handed the next connection over a control
// socket; it initialises the module then.
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
// Listen refuses a socket directory that others can write, and creates
// the socket with mode 0600; the server accepts only peers (SO_PEERCRED)
// of its own uid or root, unless Server.AllowUID says otherwise. Before it
// sends a byte, the client checks that the server runs as root or as the
// expected uid (NewClient), so a process of another user bound at the
// path receives nothing. PINs cross the socket on C_Login and are never
// logged by either side.
package remote
