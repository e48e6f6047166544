package slot

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hagroup/hagroup/internal/tokenquirk"
	"github.com/hagroup/hagroup/pkg/remote"
	"github.com/miekg/pkcs11"
)

// module is one loaded and initialised PKCS#11 module context.
type module struct {
	key      string
	path     string
	env      map[string]string
	initArgs string // C_Initialize's pReserved (ModuleRef.InitArgs)
	// serverUID is the uid a remote token's server must run as (nil:
	// ours); see remote.NewClient.
	serverUID *uint32

	// ctx and id change only under the registry lock (Reinit); sessions
	// copy ctx when they open.
	ctx p11
	id  unsafe.Pointer // the module instance (function list); nil when unknown

	refs    int  // slots using the context
	foreign bool // CKR_CRYPTOKI_ALREADY_INITIALIZED: someone else's; never finalized by us
	// inside counts the calls running on ctx on a goroutine of their own,
	// which their caller may have given up on (callOn); pending says the
	// last reference went while some were, so the context is finalized
	// when the last of them returns. Atomic, so that a call neither enters
	// nor leaves through the registry's lock (held through a Finalize);
	// pending is written under it.
	inside  atomic.Int64
	pending atomic.Bool
	private bool // loaded for one spec's module env, or a remote token: not shared by key
	wedged  bool // a Finalize/Initialize outlived its deadline: never touch ctx again

	// inc counts the finalizations by reinit: session handles of an
	// earlier incarnation are gone.
	inc atomic.Uint64

	// objects holds the object locks of the module's tokens that need
	// one (internal/tokenquirk).
	objects tokenquirk.Locks
}

// objectLock returns the object lock of token tok, nil when it needs
// none. A token served by hsmserve is locked by the server, which sees
// every client's calls.
func (m *module) objectLock(tok TokenSummary) *tokenquirk.ObjectLock {
	if remote.IsModulePath(m.path) {
		return nil
	}
	return m.objects.For(tok.SlotID, tok.Manufacturer, tok.Model)
}

// registry holds the process's module contexts. It is package state because
// a PKCS#11 module is process state: a second C_Initialize of the same
// library fails, and C_Finalize on any context shuts it down for all.
type registry struct {
	mu     sync.Mutex
	mods   map[string]*module
	serial int // makes keys of private contexts unique

	// Successful C_Initialize / C_Finalize calls per module path, ever
	// (observed by tests).
	inits, finals map[string]int
}

var modules = &registry{mods: make(map[string]*module), inits: make(map[string]int), finals: make(map[string]int)}

// finalizeTimeout bounds C_Finalize when the last user lets go.
const finalizeTimeout = 10 * time.Second

// ModuleRef says which module to load and how: its path, the environment
// it reads as it loads, the init arguments of its C_Initialize, and for a
// served token the uid its server must run as.
type ModuleRef struct {
	Path string
	Env  map[string]string
	// InitArgs is the pReserved string of C_Initialize (p11-kit's
	// x-init-reserved), such as NSS softokn's configdir='sql:DIR' …;
	// checked by internal/initargs. A module initialised with init
	// arguments is shared only by users giving the same ones.
	InitArgs  string
	ServerUID *uint32
}

// sharedKey is the registry key of ref's shared context: the module path,
// and its init arguments when it has some.
func (ref ModuleRef) sharedKey() string {
	if ref.InitArgs == "" {
		return ref.Path
	}
	return ref.Path + "\x00init\x00" + ref.InitArgs
}

// acquire returns a referenced context for ref. With an empty env the
// context is shared by every user of the same path and init arguments; a
// non-empty env gets a context of its own (set while the module is loaded
// and initialised), unless the module turns out to hand the same function
// list to every loader, in which case the existing context is shared. A
// module instance already initialised with other init arguments is an
// error: one process can initialise a module once (NSS softokn answers
// CKR_CRYPTOKI_ALREADY_INITIALIZED), and sharing that context would serve
// another token than the member names. A remote token's path
// (remote.Scheme) always gets a context, and a connection, of its own.
func (r *registry) acquire(ctx context.Context, ref ModuleRef, timeout time.Duration) (*module, error) {
	path, env := ref.Path, ref.Env
	if path == "" {
		return nil, fmt.Errorf("%w: no module path", ErrInvalidSpec)
	}
	if err := checkInitArgs(ref); err != nil {
		return nil, err
	}
	private := len(env) > 0 || remote.IsModulePath(path)
	// A served token's context is a connection of its own (private, no
	// instance to share: r.mods is not read for it), and its C_Initialize
	// the server's initialisation of its token (SoftHSM reads every object
	// then): loading and initialising it touch no state of the process, so
	// they run outside the lock, which is taken only to record the
	// context, and a process's served members open side by side rather
	// than one after another.
	served := remote.IsModulePath(path) && len(env) == 0
	if !served {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	if !private {
		if m, ok := r.mods[ref.sharedKey()]; ok {
			m.refs++
			m.pending.Store(false)
			return m, nil
		}
	}
	restore, err := withEnv(env)
	if err != nil {
		return nil, err
	}
	defer restore()

	c, id, err := loadModule(path, ref.ServerUID)
	if err != nil {
		return nil, err
	}
	if id != nil {
		for _, m := range r.mods {
			if m.id == id && !m.wedged {
				if m.initArgs != ref.InitArgs {
					return nil, fmt.Errorf("%w: module %s is already initialised in this process with other init arguments, "+
						"and a module is initialised once per process: serve each such member with hsmserve --init-args (module hagroup-remote:)",
						ErrInvalidSpec, path)
				}
				// Same module instance under another key (a symlinked
				// path, or a module that ignores its env): share it.
				c.Destroy()
				m.refs++
				m.pending.Store(false)
				return m, nil
			}
		}
	}
	foreign := false
	err = callTimeout(ctx, timeout, func() error { return initialize(c, ref.InitArgs) })
	switch {
	case err == nil:
	case errors.Is(err, pkcs11.Error(pkcs11.CKR_CRYPTOKI_ALREADY_INITIALIZED)):
		if ref.InitArgs != "" {
			// Initialised by someone else, with arguments we cannot know.
			return nil, fmt.Errorf("%w: module %s was initialised in this process by someone else, so not with this member's init arguments",
				ErrInvalidSpec, path)
		}
		foreign = true
	case errors.Is(err, ErrTimeout):
		// Initialize is still running: the context can never be used or
		// released safely. Leave it be.
		return nil, fmt.Errorf("initialise PKCS#11 module %s: %w", path, err)
	default:
		c.Destroy()
		return nil, initializeError(path, ref.InitArgs, err)
	}
	if served {
		r.mu.Lock()
		defer r.mu.Unlock()
	}
	m := &module{
		key:      ref.sharedKey(),
		path:     path,
		env:      maps.Clone(env),
		initArgs: ref.InitArgs,
		ctx:      c,
		id:       id,
		refs:     1,
		foreign:  foreign,
		private:  private,
	}
	m.serverUID = ref.ServerUID
	if !foreign {
		r.inits[path]++
	}
	if m.private {
		r.serial++
		m.key = fmt.Sprintf("%s\x00%d", m.key, r.serial)
	}
	r.mods[m.key] = m
	return m, nil
}

// release drops one reference; the last one finalizes the context (unless
// it is someone else's), or, while calls given up on still run on it
// (callOn), the last of those does: C_Finalize while another thread is
// inside the module is undefined (PKCS#11 v2.40, 5.4), and SoftHSM frees
// the token state the call reads (a SIGSEGV in C_GetTokenInfo under a
// lookup abandoned at its deadline). Meanwhile the context stays in the
// registry, and a new user takes it up again. The context is never
// destroyed (miekg's Destroy frees it and dlcloses the module): a call
// racing a shutdown may still run on it, and must meet a finalized module
// (CKR_CRYPTOKI_NOT_INITIALIZED), not freed memory — haagent once died
// with SIGSEGV in GetTokenInfo that way. The cost is one small allocation
// and a dlopen reference per module load.
func (r *registry) release(m *module) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m.refs--
	if m.refs > 0 {
		return
	}
	// pending before inside, and left the other way round: one of the
	// two sees the other (see left).
	m.pending.Store(true)
	if m.inside.Load() > 0 {
		return
	}
	r.finalizeLocked(m)
}

// finalizeLocked takes m, which nobody uses, out of the registry and
// finalizes its context. Callers hold r.mu.
func (r *registry) finalizeLocked(m *module) {
	m.pending.Store(false)
	if r.mods[m.key] == m {
		delete(r.mods, m.key)
	}
	if m.wedged || m.foreign {
		return
	}
	c := m.ctx
	err := callTimeout(context.Background(), finalizeTimeout, func() error { return c.Finalize() })
	if errors.Is(err, ErrTimeout) {
		m.wedged = true
		return
	}
	if err == nil {
		r.finals[m.path]++
	}
}

// callOn is callTimeout for a call on m's context: m stays initialised
// until fn returns, however long after its caller gave up (see release).
func callOn(ctx context.Context, m *module, timeout time.Duration, fn func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	modules.enter(m)
	return wait(ctx, timeout, func() error {
		defer modules.left(m)
		return fn()
	})
}

// enter notes a call about to run on m's context on a goroutine of its
// own; left, once it returned.
func (r *registry) enter(m *module) { m.inside.Add(1) }

// left notes that a call entered on m returned, and finalizes m if it
// was the last call inside once nobody used m (release). The count goes
// down before pending is read, and release sets pending before it reads
// the count: so either release sees no call inside and finalizes, or the
// last call out sees pending and does.
func (r *registry) left(m *module) {
	if m.inside.Add(-1) > 0 || !m.pending.Load() {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if m.pending.Load() && m.inside.Load() == 0 && m.refs == 0 {
		r.finalizeLocked(m)
	}
}

// owns reports whether m is used by exactly one slot and was initialised by
// us for that slot alone, so that the slot may finalize it.
func (r *registry) owns(m *module) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return m.private && !m.foreign && m.refs == 1
}

// reinit finalizes and initialises again a context owned by one slot, with
// its module env set. A context whose Finalize or Initialize hangs is
// abandoned and a fresh one is loaded in its place on the next attempt.
func (r *registry) reinit(ctx context.Context, m *module, timeout time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !(m.private && !m.foreign && m.refs == 1) {
		return fmt.Errorf("%w: module context of %s is shared", ErrInvalidSpec, m.path)
	}
	restore, err := withEnv(m.env)
	if err != nil {
		return err
	}
	defer restore()
	if m.wedged {
		c, id, err := loadModule(m.path, m.serverUID)
		if err != nil {
			return fmt.Errorf("reload PKCS#11 module %s: %w", m.path, err)
		}
		m.ctx, m.id, m.wedged = c, id, false
		m.inc.Add(1)
	} else {
		c := m.ctx
		err := callTimeout(ctx, timeout, func() error { return c.Finalize() })
		switch {
		case errors.Is(err, ErrTimeout):
			m.wedged = true
			return fmt.Errorf("finalize PKCS#11 module %s: %w", m.path, err)
		case err == nil:
			r.finals[m.path]++
		}
		m.inc.Add(1)
		// Any other Finalize error (the connection is dead, the context
		// was not initialised) still leaves the context ready for
		// Initialize.
	}
	c := m.ctx
	err = callTimeout(ctx, timeout, func() error { return initialize(c, m.initArgs) })
	switch {
	case err == nil:
		r.inits[m.path]++
		return nil
	case errors.Is(err, ErrTimeout):
		m.wedged = true
	}
	return fmt.Errorf("initialise PKCS#11 module %s again: %w", m.path, err)
}

// current returns the context of m.
func (r *registry) current(m *module) p11 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return m.ctx
}

// A module reads its module env (Spec.ModuleEnv) from the process
// environment as it loads: p11-kit-client.so, for one, reads
// P11_KIT_SERVER_ADDRESS with secure_getenv in C_GetFunctionList and has
// no other way to be told (no init arguments, no configuration key).
// Writing the environment of a process whose other threads may be reading
// it races glibc's setenv against getenv, which can crash the process, so
// hagroup never writes the environment of an application it is loaded
// into (libhapkcs11.so): there each variable must already hold the
// member's value, set by the operator before the application starts. Only
// a hagroup program that owns its process (OwnEnvironment: haagent,
// hactl, the test binaries) has it written, under the registry lock,
// while the module loads, and restored after.
var ownEnv atomic.Bool

// OwnEnvironment declares that this process is a hagroup program that owns
// its environment, not an application that loaded hagroup as a library:
// members' module env is then written into the process environment while
// their module loads (see registry.go). Call it at the start of main,
// before any module is loaded.
func OwnEnvironment() { ownEnv.Store(true) }

// withEnv makes env the module's environment while it loads, and returns a
// function restoring what was there. Without OwnEnvironment it only checks
// that the process environment already holds env. Callers hold the
// registry lock.
func withEnv(env map[string]string) (restore func(), err error) {
	if len(env) == 0 {
		return func() {}, nil
	}
	keys := slices.Sorted(maps.Keys(env))
	if !ownEnv.Load() {
		for _, k := range keys {
			if v, ok := os.LookupEnv(k); !ok || v != env[k] {
				return nil, fmt.Errorf("%w: module_env %s is not set to the member's value in this process's environment, "+
					"and hagroup does not write the environment of an application it is loaded into: set %s before the application starts, "+
					"or serve the token with hsmserve (hagroup-remote:), which needs no environment", ErrInvalidSpec, k, k)
			}
		}
		return func() {}, nil
	}
	type old struct {
		v   string
		had bool
	}
	saved := make(map[string]old, len(env))
	for _, k := range keys {
		v, had := os.LookupEnv(k)
		saved[k] = old{v, had}
		os.Setenv(k, env[k])
	}
	return func() {
		for k, o := range saved {
			if o.had {
				os.Setenv(k, o.v)
			} else {
				os.Unsetenv(k)
			}
		}
	}, nil
}

// callTimeout runs fn on a goroutine of its own and waits for it at most
// timeout, and not beyond ctx. On timeout fn keeps running; the error wraps
// ErrTimeout. Used for the calls that are not on a session (module set-up,
// token and mechanism information).
func callTimeout(ctx context.Context, timeout time.Duration, fn func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return wait(ctx, timeout, fn)
}

// wait runs fn on a goroutine of its own and waits for it at most timeout,
// and not beyond ctx (callTimeout without the first look at ctx).
func wait(ctx context.Context, timeout time.Duration, fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("%w (%v)", ErrTimeout, timeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}
