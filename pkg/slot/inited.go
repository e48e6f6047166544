package slot

import "context"

// The single-part calls of an operation the application initialised with
// its own *Init on this session (C_SignInit, then C_Sign): unlike Sign and
// the others above, they send no Init, so an Init error reached the
// application at its *Init call, as on a bare token.

// SignInitialized is C_Sign after SignInit.
func (ss *Session) SignInitialized(ctx context.Context, data []byte) ([]byte, error) {
	return result(ctx, ss.operations, OpSign, false, func(x *sess) ([]byte, error) { return x.ctx.Sign(x.h, data) })
}

// VerifyInitialized is C_Verify after VerifyInit.
func (ss *Session) VerifyInitialized(ctx context.Context, data, sig []byte) error {
	return ss.call(ctx, OpVerify, false, func(x *sess) error { return x.ctx.Verify(x.h, data, sig) })
}

// EncryptInitialized is C_Encrypt after EncryptInit.
func (ss *Session) EncryptInitialized(ctx context.Context, data []byte) ([]byte, error) {
	return result(ctx, ss.operations, OpEncrypt, false, func(x *sess) ([]byte, error) { return x.ctx.Encrypt(x.h, data) })
}

// DecryptInitialized is C_Decrypt after DecryptInit.
func (ss *Session) DecryptInitialized(ctx context.Context, data []byte) ([]byte, error) {
	return result(ctx, ss.operations, OpDecrypt, false, func(x *sess) ([]byte, error) { return x.ctx.Decrypt(x.h, data) })
}

// DigestInitialized is C_Digest after DigestInit.
func (ss *Session) DigestInitialized(ctx context.Context, data []byte) ([]byte, error) {
	return result(ctx, ss.operations, OpDigest, false, func(x *sess) ([]byte, error) { return x.ctx.Digest(x.h, data) })
}
