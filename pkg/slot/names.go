package slot

// PKCS#11 3.0 names that miekg/pkcs11 1.1.2 lacks, for this package and
// those above it.
const (
	CKKECEdwards              = 0x40   // CKK_EC_EDWARDS: Ed25519, Ed448
	CKKECMontgomery           = 0x41   // CKK_EC_MONTGOMERY: X25519, X448
	CKMECEdwardsKeyPairGen    = 0x1055 // CKM_EC_EDWARDS_KEY_PAIR_GEN
	CKMECMontgomeryKeyPairGen = 0x1056 // CKM_EC_MONTGOMERY_KEY_PAIR_GEN
	CKMEdDSA                  = 0x1057 // CKM_EDDSA
)
