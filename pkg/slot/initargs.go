package slot

import (
	"errors"
	"fmt"

	"github.com/hagroup/hagroup/internal/initargs"
	"github.com/hagroup/hagroup/internal/p11raw"
	"github.com/hagroup/hagroup/pkg/remote"
	"github.com/miekg/pkcs11"
)

// checkInitArgs refuses init arguments that initargs.Check refuses, and
// init arguments for a served token: its module is initialised by its
// server, which takes them (hsmserve --init-args).
func checkInitArgs(ref ModuleRef) error {
	if ref.InitArgs == "" {
		return nil
	}
	if remote.IsModulePath(ref.Path) {
		return fmt.Errorf("%w: init arguments for %s: a served token's module is initialised by its server; give them to hsmserve (--init-args)",
			ErrInvalidSpec, ref.Path)
	}
	if err := initargs.Check(ref.InitArgs); err != nil {
		return fmt.Errorf("%w: module %s: %v", ErrInvalidSpec, ref.Path, err)
	}
	return nil
}

// initialize calls C_Initialize on c with init arguments args (none when
// empty). Only an in-process module takes them: checkInitArgs has refused
// them for a served one.
func initialize(c p11, args string) error {
	if mc, ok := c.(*miekgModule); ok {
		return p11raw.Initialize(mc.Ctx, args)
	}
	if args != "" {
		return fmt.Errorf("%w: this module cannot take init arguments", ErrInvalidSpec)
	}
	return c.Initialize()
}

// initializeError is the error of a C_Initialize that failed with err. A
// module that answers CKR_ARGUMENTS_BAD to a call without init arguments
// most likely needs some (NSS softokn does), and the operator is told so.
func initializeError(path, args string, err error) error {
	if args == "" && errors.Is(err, pkcs11.Error(pkcs11.CKR_ARGUMENTS_BAD)) {
		return fmt.Errorf("initialise PKCS#11 module %s: %w: init arguments may be missing: this module may need the pReserved string of C_Initialize "+
			"(the member's init_args, hactl's --init-args; NSS softokn needs configdir='sql:DIR' certPrefix='' keyPrefix='' secmod='secmod.db')",
			path, err)
	}
	if args != "" && errors.Is(err, pkcs11.Error(pkcs11.CKR_ARGUMENTS_BAD)) {
		return fmt.Errorf("initialise PKCS#11 module %s: %w: the module refuses these init arguments (SoftHSM takes none)", path, err)
	}
	return fmt.Errorf("initialise PKCS#11 module %s: %w", path, err)
}
