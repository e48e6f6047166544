package member

import (
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/slot"
	"github.com/hagroup/hagroup/pkg/slot/dispatch"
)

// SlotSpec is how member m's token is opened under settings s: the one
// mapping from the configuration to pkg/slot, used by the engine, the
// module's physical slots and the agent's and hactl's direct opens. What
// the configuration does not hold is the caller's to add: the PIN (read
// from m's PIN source, or the application's), the pool cap, a test's
// interceptor.
//
// It lives here because a member is where a configured token becomes a
// slot: pkg/slot must not know the TOML schema, and pkg/config must not
// pull in the PKCS#11 machinery every config reader would then link.
func SlotSpec(m config.Member, s config.Settings) slot.Spec {
	return slot.Spec{
		Name:           m.Name,
		Module:         m.Module,
		ModuleEnv:      m.ModuleEnv,
		InitArgs:       m.InitArgs,
		TokenLabel:     m.TokenLabel,
		TokenSerial:    m.TokenSerial,
		URI:            m.URI,
		ServerUID:      m.ExpectedServerUID(),
		CommandTimeout: s.CommandTimeout,
		KeygenTimeout:  s.KeygenTimeout,
		Dispatch:       dispatch.Dispatch(m.Dispatch),
	}
}
