package slot_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/miekg/pkcs11"
)

// Not parallel: it counts Initialize/Finalize of the shared SoftHSM context,
// which parallel tests would share.
func TestRegistrySharesOneContextPerModule(t *testing.T) {
	toks := testhsm.Take(t, 2)
	mod := toks[0].Module
	refs0, inits0, finals0 := slot.ModuleCounts(mod)
	if refs0 != 0 {
		t.Fatalf("module %s still has %d users before the test", mod, refs0)
	}

	a := open(t, specOf(toks[0]))
	b := open(t, specOf(toks[1]))
	refs, inits, finals := slot.ModuleCounts(mod)
	if refs != 2 || inits != inits0+1 || finals != finals0 {
		t.Fatalf("two slots on one module: refs %d, inits +%d, finals +%d; want 2, +1, +0", refs, inits-inits0, finals-finals0)
	}
	if a.OwnsContext() || b.OwnsContext() {
		t.Fatalf("slots on a shared context claim to own it")
	}
	_, privB := newECKey(t, b, "after-close")

	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, _, finals := slot.ModuleCounts(mod); finals != finals0 {
		t.Fatalf("Close of one slot finalized the module the other still uses")
	}
	// The remaining slot still works: the context was not finalized under it.
	if _, err := signDigest(ctxT(t), b, privB, []byte("still here")); err != nil {
		t.Fatalf("Sign on the remaining slot after the other's Close: %v", err)
	}
	if _, err := signDigest(ctxT(t), a, privB, []byte("x")); !errors.Is(err, slot.ErrClosed) {
		t.Fatalf("Sign on a closed slot: %v, want ErrClosed", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	b.Close()
	refs, _, finals = slot.ModuleCounts(mod)
	if refs != 0 || finals != finals0+1 {
		t.Fatalf("after the last Close: refs %d, finals +%d; want 0, +1", refs, finals-finals0)
	}

	// Loading again after the last Close initialises afresh.
	c := open(t, specOf(toks[1]))
	if got := findOne(t, c, pkcs11.CKO_PRIVATE_KEY, "after-close"); got == 0 {
		t.Fatalf("no key after reload")
	}
	if _, inits, _ := slot.ModuleCounts(mod); inits != inits0+2 {
		t.Fatalf("reopen after the last Close: inits +%d, want +2", inits-inits0)
	}
}

// A context initialised by someone else in the process is used and never
// finalized by us.
func TestRegistryAcceptsForeignInitialize(t *testing.T) {
	tok := testhsm.Take(t, 1)[0]
	raw := pkcs11.New(tok.Module)
	if raw == nil {
		t.Fatalf("load %s", tok.Module)
	}
	if err := raw.Initialize(); err != nil {
		t.Fatalf("raw Initialize: %v", err)
	}
	defer func() {
		raw.Finalize()
		raw.Destroy()
	}()
	_, _, finals0 := slot.ModuleCounts(tok.Module)
	s := open(t, specOf(tok))
	if _, err := s.GenerateRandom(ctxT(t), 8); err != nil {
		t.Fatalf("GenerateRandom on a foreign-initialised module: %v", err)
	}
	s.Close()
	if _, _, finals := slot.ModuleCounts(tok.Module); finals != finals0 {
		t.Fatalf("we finalized a module someone else initialised")
	}
	// The other user's context still works.
	if _, err := raw.GetSlotList(true); err != nil {
		t.Fatalf("the other user's context after our Close: %v", err)
	}
}

func TestModuleEnvGetsOwnContext(t *testing.T) {
	t.Parallel()
	srv := testhsm.Serve(t, "own-ctx")
	tok := srv.Token()
	s := open(t, specOf(tok))
	if !s.OwnsContext() {
		t.Fatalf("a slot with a module env does not own its context")
	}
	// A second spec with the same env gets a context of its own as well.
	s2 := open(t, specOf(tok))
	if !s2.OwnsContext() || !s.OwnsContext() {
		t.Fatalf("two specs with module envs share a context")
	}
	if _, err := s2.GenerateRandom(ctxT(t), 4); err != nil {
		t.Fatalf("GenerateRandom through p11-kit: %v", err)
	}
}

func TestOpenBadModule(t *testing.T) {
	t.Parallel()
	_, err := slot.Open(ctxT(t), slot.Spec{Name: "ghost", Module: "/nonexistent/libnothing.so", TokenLabel: "x"})
	if err == nil || !strings.Contains(err.Error(), "member ghost") || !strings.Contains(err.Error(), "/nonexistent/libnothing.so") {
		t.Fatalf("Open of a missing module: %v; want an error naming the member and module", err)
	}
}

// SoftHSM hands every loader the same function list: a spec with a module
// env on it cannot have a context of its own, and shares the one there is
// instead of initialising (and later finalizing) it a second time.
func TestModuleEnvOnSharedLibraryShares(t *testing.T) {
	toks := testhsm.Take(t, 2)
	mod := toks[0].Module
	_, _, finals0 := slot.ModuleCounts(mod)

	withEnv := specOf(toks[0])
	withEnv.ModuleEnv = map[string]string{"HAGROUP_TEST_ENV": "1"}
	a := open(t, withEnv)
	if !a.OwnsContext() {
		t.Fatalf("the only user of a context loaded for its env does not own it")
	}
	b := open(t, specOf(toks[1]))
	if a.OwnsContext() || b.OwnsContext() {
		t.Fatalf("two slots on one SoftHSM instance: owns %v/%v, want neither", a.OwnsContext(), b.OwnsContext())
	}
	if v, ok := os.LookupEnv("HAGROUP_TEST_ENV"); ok {
		t.Fatalf("module env left in the process environment: %q", v)
	}
	// Reinit of a slot that shares its context must not finalize it.
	if err := a.Reinit(ctxT(t)); err != nil {
		t.Fatalf("Reinit: %v", err)
	}
	if _, _, finals := slot.ModuleCounts(mod); finals != finals0 {
		t.Fatalf("Reinit finalized a shared context")
	}
	if _, err := b.GenerateRandom(ctxT(t), 4); err != nil {
		t.Fatalf("the other slot after Reinit: %v", err)
	}
	a.Close()
	if _, err := b.GenerateRandom(ctxT(t), 4); err != nil {
		t.Fatalf("the other slot after Close: %v", err)
	}
	b.Close()
	if _, _, finals := slot.ModuleCounts(mod); finals != finals0+1 {
		t.Fatalf("after the last Close: finals +%d, want +1", finals-finals0)
	}
}

// In an application hagroup is loaded into, a member's module_env is never
// written into the process environment: Open says which variable the
// operator must set, and works once the application's environment has it.
// (Not parallel: it changes process state.)
func TestModuleEnvNotWrittenInAGuest(t *testing.T) {
	srv := testhsm.Serve(t, "guest")
	spec := specOf(srv.Token())
	if len(spec.ModuleEnv) != 1 || spec.ModuleEnv["P11_KIT_SERVER_ADDRESS"] == "" {
		t.Fatalf("served token's module env = %v, want P11_KIT_SERVER_ADDRESS", spec.ModuleEnv)
	}
	was := slot.SetOwnEnvironment(false)
	t.Cleanup(func() { slot.SetOwnEnvironment(was) })
	t.Setenv("P11_KIT_SERVER_ADDRESS", "")
	os.Unsetenv("P11_KIT_SERVER_ADDRESS")

	_, err := slot.Open(ctxT(t), spec)
	if err == nil || !strings.Contains(err.Error(), "member "+spec.Name) || !strings.Contains(err.Error(), "module_env P11_KIT_SERVER_ADDRESS") {
		t.Fatalf("Open of a p11-kit member in a guest process without its address: %v; want an error naming the member and the variable", err)
	}
	if v, set := os.LookupEnv("P11_KIT_SERVER_ADDRESS"); set {
		t.Fatalf("Open wrote P11_KIT_SERVER_ADDRESS=%q into the process environment", v)
	}

	t.Setenv("P11_KIT_SERVER_ADDRESS", spec.ModuleEnv["P11_KIT_SERVER_ADDRESS"]) // the operator's way
	s := open(t, spec)
	if _, err := s.GenerateRandom(ctxT(t), 4); err != nil {
		t.Fatalf("GenerateRandom on the member once the environment holds its address: %v", err)
	}
}
