package slot

import (
	"context"
	"fmt"

	"github.com/hagroup/hagroup/internal/p11raw"
)

// ModuleCounts returns, for module path, the number of slots sharing its
// shared (no module env) context and how many times it was initialised and
// finalized by this package.
func ModuleCounts(path string) (refs, inits, finals int) {
	modules.mu.Lock()
	defer modules.mu.Unlock()
	if m, ok := modules.mods[path]; ok {
		refs = m.refs
	}
	return refs, modules.inits[path], modules.finals[path]
}

// WaitQuarantine waits until no call of s is quarantined.
func WaitQuarantine(ctx context.Context, s *Slot) error { return s.waitQuarantine(ctx) }

// CheckFunctionList checks that the function list the slot reaches for
// nested templates and one-shot operations is the module's: its entries must be the module's
// exported C_ functions (true of SoftHSM, which exports them).
func CheckFunctionList(s *Slot) error {
	mm, ok := s.st.Load().ctx.(*miekgModule)
	if !ok {
		return fmt.Errorf("%s is not an in-process module", s.spec.Module)
	}
	if mm.fl == nil {
		return fmt.Errorf("no function list: %v", mm.flErr)
	}
	for i, name := range map[int]string{3: "C_GetFunctionList", 20: "C_CreateObject", 24: "C_GetAttributeValue",
		29: "C_EncryptInit", 30: "C_Encrypt", 33: "C_DecryptInit", 34: "C_Decrypt", 37: "C_DigestInit", 38: "C_Digest",
		42: "C_SignInit", 43: "C_Sign", 48: "C_VerifyInit", 49: "C_Verify"} {
		want := p11raw.ExportedSymbol(s.spec.Module, name)
		if want == nil {
			return fmt.Errorf("%s does not export %s", s.spec.Module, name)
		}
		if got := p11raw.FunctionListEntry(mm.fl, i); got != want {
			return fmt.Errorf("function list entry %d is %p, %s is %p", i, got, name, want)
		}
	}
	return nil
}

// SetTokenIdentity makes s decide its token's object lock as for a token
// of the given manufacturer and model (as C_GetTokenInfo reports them),
// from its next call on.
func SetTokenIdentity(s *Slot, manufacturer, model string) {
	st := *s.st.Load()
	st.token.Manufacturer, st.token.Model = manufacturer, model
	st.objects = s.mod.objectLock(st.token)
	s.st.Store(&st)
}

// SetOwnEnvironment sets whether the process owns its environment (see
// OwnEnvironment) and returns what it was.
func SetOwnEnvironment(own bool) (was bool) { return ownEnv.Swap(own) }

// ObjectLockWriting reports whether a call of s holds its token's object
// lock for writing.
func ObjectLockWriting(s *Slot) bool { return s.st.Load().objects.Writing() }

// ModuleCallsInside returns how many calls callOn (or Slot.direct) is
// running on the contexts of module path.
func ModuleCallsInside(path string) int {
	modules.mu.Lock()
	defer modules.mu.Unlock()
	n := 0
	for _, m := range modules.mods {
		if m.path == path {
			n += int(m.inside.Load())
		}
	}
	return n
}

// Capacity returns the pool cap.
func (s *Slot) Capacity() int { return s.capacity }
