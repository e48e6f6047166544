package group_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"fmt"

	"github.com/hagroup/hagroup/internal/testhsm"
	"github.com/hagroup/hagroup/pkg/config"
	"github.com/hagroup/hagroup/pkg/group"
	"github.com/hagroup/hagroup/pkg/group/signer"
	"github.com/hagroup/hagroup/pkg/secret"
	"github.com/hagroup/hagroup/pkg/sync/domainkey"
	"github.com/miekg/pkcs11"
)

// Three SoftHSM tokens (made by the test harness) become one group; a key
// generated through it lands on all three, and a crypto.Signer on it keeps
// signing while members fail.
func Example() {
	ctx := context.Background()
	cfg := config.Group{Label: "signing", Serial: "1000001"}
	for i := range 3 {
		cfg.Members = append(cfg.Members, config.Member{
			Name:       fmt.Sprintf("hsm-%c", 'a'+i),
			Module:     testhsm.SoftHSMModule,
			TokenLabel: fmt.Sprintf("example-%c", 'a'+i), // made for this example by TestMain
		})
	}
	g, err := group.Open(ctx, cfg, config.Defaults(), group.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer g.Close()
	if err := g.Login(ctx, pkcs11.CKU_USER, secret.PINFromString(testhsm.UserPIN)); err != nil {
		fmt.Println(err)
		return
	}

	// Once per group: a domain key on every member, under which keys are
	// replicated (`hactl hagroup domain` does this, trusted with the SO PIN).
	var targets []domainkey.Target
	for _, m := range g.Members() {
		mm, _ := g.Member(m.Name)
		targets = append(targets, domainkey.Target{Slot: mm.Slot()})
	}
	if err := domainkey.Install(ctx, targets, g.Serial()); err != nil {
		fmt.Println(err)
		return
	}

	s, err := g.OpenSession(ctx, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	p256 := []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}
	_, _, err = s.GenerateKeyPair(ctx, pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil),
		[]*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
			pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, p256),
			pkcs11.NewAttribute(pkcs11.CKA_LABEL, "example"),
		},
		[]*pkcs11.Attribute{
			pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true),
			pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
			pkcs11.NewAttribute(pkcs11.CKA_SIGN, true),
			pkcs11.NewAttribute(pkcs11.CKA_LABEL, "example"),
		})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("replications:", g.Members()[1].Replications+g.Members()[2].Replications)

	signer, err := signer.New(ctx, g, signer.KeySelector{Label: "example"})
	if err != nil {
		fmt.Println(err)
		return
	}
	pub := signer.Public().(*ecdsa.PublicKey)
	for _, down := range []string{"", "hsm-a", "hsm-b"} {
		if down != "" {
			g.FailMember(down, fmt.Errorf("maintenance"))
		}
		digest := sha256.Sum256([]byte("hello"))
		sig, err := signer.Sign(rand.Reader, digest[:], crypto.SHA256)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("active %d, signature verifies: %v\n", g.Status().Active, ecdsa.VerifyASN1(pub, digest[:], sig))
	}
	// Output:
	// replications: 4
	// active 3, signature verifies: true
	// active 2, signature verifies: true
	// active 1, signature verifies: true
}
