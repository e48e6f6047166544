package slot

import "context"

// The single-part calls of an operation the application initialised with
// its own *Init on this session (C_SignInit, then C_Sign): unlike Sign and
// the others above, they send no Init, so an Init error reached the
// application at its *Init call, as on a bare token.

// SignInitialized is C_Sign after SignInit.
func (ss *Session) SignInitialized(ctx context.Context, data []byte) ([]byte, error) {
	return ss.output(ctx, OpSign, func(x *sess) ([]byte, error) { return x.ctx.Sign(x.h, data) })
}

// VerifyInitialized is C_Verify after VerifyInit.
func (ss *Session) VerifyInitialized(ctx context.Context, data, sig []byte) error {
	return ss.call(ctx, OpVerify, false, func(x *sess) error { return x.ctx.Verify(x.h, data, sig) })
}

// EncryptInitialized is C_Encrypt after EncryptInit.
func (ss *Session) EncryptInitialized(ctx context.Context, data []byte) ([]byte, error) {
	return ss.output(ctx, OpEncrypt, func(x *sess) ([]byte, error) { return x.ctx.Encrypt(x.h, data) })
}

// DecryptInitialized is C_Decrypt after DecryptInit.
func (ss *Session) DecryptInitialized(ctx context.Context, data []byte) ([]byte, error) {
	return ss.output(ctx, OpDecrypt, func(x *sess) ([]byte, error) { return x.ctx.Decrypt(x.h, data) })
}

// DigestInitialized is C_Digest after DigestInit.
func (ss *Session) DigestInitialized(ctx context.Context, data []byte) ([]byte, error) {
	return ss.output(ctx, OpDigest, func(x *sess) ([]byte, error) { return x.ctx.Digest(x.h, data) })
}

// output runs a call that returns bytes, read only once the call returned.
func (ss *Session) output(ctx context.Context, op Op, fn func(x *sess) ([]byte, error)) ([]byte, error) {
	var out []byte
	err := ss.call(ctx, op, false, func(x *sess) error {
		v, err := fn(x)
		out = v
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
