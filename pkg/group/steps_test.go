package group

import (
	"context"

	"github.com/miekg/pkcs11"
)

// The PKCS#11-shaped steps of the multi-part operations, for the tests:
// the module and Go programs run them through Init and Do.

// SignUpdate feeds data to a multi-part signature.
func (s *Session) SignUpdate(ctx context.Context, data []byte) error {
	_, err := s.Do(ctx, OpSign, StepUpdate, data, nil, RoomAny)
	return err
}

// SignFinal returns the multi-part signature and ends the operation.
func (s *Session) SignFinal(ctx context.Context) ([]byte, error) {
	return s.Do(ctx, OpSign, StepFinal, nil, nil, RoomAny)
}

// VerifyInit starts a verification with key (see Init).
func (s *Session) VerifyInit(ctx context.Context, mech *pkcs11.Mechanism, key ObjectHandle) error {
	return s.Init(ctx, OpVerify, mech, key)
}

// Verify checks sig over data in one part. A bad signature is
// CKR_SIGNATURE_INVALID, never a failover.
func (s *Session) Verify(ctx context.Context, data, sig []byte) error {
	_, err := s.Do(ctx, OpVerify, StepSingle, data, sig, RoomAny)
	return err
}

// VerifyUpdate feeds data to a multi-part verification.
func (s *Session) VerifyUpdate(ctx context.Context, data []byte) error {
	_, err := s.Do(ctx, OpVerify, StepUpdate, data, nil, RoomAny)
	return err
}

// VerifyFinal checks sig and ends the multi-part verification.
func (s *Session) VerifyFinal(ctx context.Context, sig []byte) error {
	_, err := s.Do(ctx, OpVerify, StepFinal, nil, sig, RoomAny)
	return err
}

// EncryptInit starts an encryption with key (see Init).
func (s *Session) EncryptInit(ctx context.Context, mech *pkcs11.Mechanism, key ObjectHandle) error {
	return s.Init(ctx, OpEncrypt, mech, key)
}

// Encrypt encrypts data in one part.
func (s *Session) Encrypt(ctx context.Context, data []byte) ([]byte, error) {
	return s.Do(ctx, OpEncrypt, StepSingle, data, nil, RoomAny)
}

// EncryptUpdate feeds data to a multi-part encryption.
func (s *Session) EncryptUpdate(ctx context.Context, data []byte) ([]byte, error) {
	return s.Do(ctx, OpEncrypt, StepUpdate, data, nil, RoomAny)
}

// EncryptFinal ends a multi-part encryption.
func (s *Session) EncryptFinal(ctx context.Context) ([]byte, error) {
	return s.Do(ctx, OpEncrypt, StepFinal, nil, nil, RoomAny)
}

// DecryptInit starts a decryption with key (see Init).
func (s *Session) DecryptInit(ctx context.Context, mech *pkcs11.Mechanism, key ObjectHandle) error {
	return s.Init(ctx, OpDecrypt, mech, key)
}

// Decrypt decrypts data in one part.
func (s *Session) Decrypt(ctx context.Context, data []byte) ([]byte, error) {
	return s.Do(ctx, OpDecrypt, StepSingle, data, nil, RoomAny)
}

// DecryptUpdate feeds data to a multi-part decryption.
func (s *Session) DecryptUpdate(ctx context.Context, data []byte) ([]byte, error) {
	return s.Do(ctx, OpDecrypt, StepUpdate, data, nil, RoomAny)
}

// DecryptFinal ends a multi-part decryption.
func (s *Session) DecryptFinal(ctx context.Context) ([]byte, error) {
	return s.Do(ctx, OpDecrypt, StepFinal, nil, nil, RoomAny)
}

// DigestInit starts a digest.
func (s *Session) DigestInit(ctx context.Context, mech *pkcs11.Mechanism) error {
	return s.Init(ctx, OpDigest, mech, 0)
}

// Digest digests data in one part.
func (s *Session) Digest(ctx context.Context, data []byte) ([]byte, error) {
	return s.Do(ctx, OpDigest, StepSingle, data, nil, RoomAny)
}

// DigestUpdate feeds data to a multi-part digest.
func (s *Session) DigestUpdate(ctx context.Context, data []byte) error {
	_, err := s.Do(ctx, OpDigest, StepUpdate, data, nil, RoomAny)
	return err
}

// DigestFinal ends a multi-part digest.
func (s *Session) DigestFinal(ctx context.Context) ([]byte, error) {
	return s.Do(ctx, OpDigest, StepFinal, nil, nil, RoomAny)
}
