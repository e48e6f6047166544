package group

import (
	"crypto/ecdsa"
	"math/big"
)

func verifyRaw(pub *ecdsa.PublicKey, digest, raw []byte) bool {
	n := len(raw) / 2
	return ecdsa.Verify(pub, digest, new(big.Int).SetBytes(raw[:n]), new(big.Int).SetBytes(raw[n:]))
}
