package slot

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/miekg/pkcs11"
)

// initTokenTimeout bounds the whole of InitToken (SoftHSM: a few ms).
const initTokenTimeout = 30 * time.Second

// tokenIniter is what InitToken needs beyond p11: an in-process module
// (*pkcs11.Ctx) has it, a remote token does not.
type tokenIniter interface {
	InitToken(slotID uint, soPIN, label string) error
	InitPIN(sh pkcs11.SessionHandle, pin string) error
}

// InitToken initialises afresh the token whose serial number is serial in
// the in-process module path (C_InitToken, then C_InitPIN as the SO): every
// object goes, the token takes the new label and the two PINs, and returns
// its serial number (SoftHSM keeps the old one). It runs on the
// process's shared context of path, under the registry's reference
// counting, so it never initialises or finalizes the module behind a
// Slot's back; a module context is process state, so a test harness that
// re-initialises tokens (internal/testhsm) must go through here. The
// module refuses (CKR_SESSION_EXISTS) while any session of this process is
// open on the token.
func InitToken(ctx context.Context, path, serial, label string, soPIN, userPIN secret.PIN) (string, error) {
	return InitModuleToken(ctx, ModuleRef{Path: path}, serial, label, soPIN, userPIN)
}

// InitModuleToken is InitToken on the module of ref, loaded with its
// environment and init arguments (a test rig's tpm2-pkcs11 store, say).
func InitModuleToken(ctx context.Context, ref ModuleRef, serial, label string, soPIN, userPIN secret.PIN) (string, error) {
	path := ref.Path
	m, err := modules.acquire(ctx, ref, initTokenTimeout)
	if err != nil {
		return "", err
	}
	defer modules.release(m)
	c := modules.current(m)
	ti, ok := c.(tokenIniter)
	if !ok {
		return "", fmt.Errorf("%w: module %s cannot initialise tokens in this process", ErrInvalidSpec, path)
	}
	var fresh string
	err = callOn(ctx, m, initTokenTimeout, func() error {
		id, err := slotOfSerial(c, serial)
		if err != nil {
			return err
		}
		if err := ti.InitToken(id, soPIN.Reveal(), label); err != nil {
			return fmt.Errorf("C_InitToken: %w", err)
		}
		if err := initUserPIN(c, ti, id, soPIN, userPIN); err != nil {
			return err
		}
		info, err := c.GetTokenInfo(id)
		if err != nil {
			return fmt.Errorf("C_GetTokenInfo: %w", err)
		}
		fresh = strings.TrimSpace(info.SerialNumber)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("initialise token %s of %s: %w", serial, path, err)
	}
	return fresh, nil
}

// slotOfSerial finds the slot holding the token with serial number serial.
func slotOfSerial(c p11, serial string) (uint, error) {
	ids, err := c.GetSlotList(true)
	if err != nil {
		return 0, fmt.Errorf("C_GetSlotList: %w", err)
	}
	for _, id := range ids {
		info, err := c.GetTokenInfo(id)
		if err != nil {
			continue // a slot whose token cannot answer is not ours
		}
		if strings.TrimSpace(info.SerialNumber) == serial {
			return id, nil
		}
	}
	return 0, errors.New("no slot holds the token")
}

// initUserPIN logs the SO in on a new session of slot id and sets the user
// PIN.
func initUserPIN(c p11, ti tokenIniter, id uint, soPIN, userPIN secret.PIN) error {
	sh, err := c.OpenSession(id, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		return fmt.Errorf("C_OpenSession: %w", err)
	}
	defer c.CloseSession(sh)
	if err := c.Login(sh, pkcs11.CKU_SO, soPIN.Reveal()); err != nil {
		return fmt.Errorf("C_Login as SO: %w", err)
	}
	defer c.Logout(sh)
	if err := ti.InitPIN(sh, userPIN.Reveal()); err != nil {
		return fmt.Errorf("C_InitPIN: %w", err)
	}
	return nil
}
