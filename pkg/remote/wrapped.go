package remote

import "github.com/miekg/pkcs11"

// WrappedKeyMissing answers a C_UnwrapKey whose wrapped key is none (a
// NULL pointer: CKR_ARGUMENTS_BAD) or empty (CKR_WRAPPED_KEY_LEN_RANGE: no
// mechanism unwraps nothing), as SoftHSM does, and is nil for any other.
// miekg/pkcs11 cannot pass either to a module (its UnwrapKey takes the
// address of the first byte and panics), so whoever calls it answers
// these itself: pkg/slot for every member, and the server for any client.
func WrappedKeyMissing(blob []byte) error {
	switch {
	case blob == nil:
		return pkcs11.Error(pkcs11.CKR_ARGUMENTS_BAD)
	case len(blob) == 0:
		return pkcs11.Error(pkcs11.CKR_WRAPPED_KEY_LEN_RANGE)
	}
	return nil
}
