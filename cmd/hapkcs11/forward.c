/*
 * forward.c — one C entry point per PKCS#11 v2.40 function (except
 * C_Initialize, C_Finalize and C_GetFunctionList, in entry.c). Each checks
 * the caller is not a forked child, takes the application's mutex when it
 * asked for its own locking, and calls the Go side (hapXxx in abi.go).
 * Mechanical: every function has the same shape.
 */
#include "hapkcs11.h"
#include "entry.h"
#include "_cgo_export.h"

CK_RV C_GetInfo(CK_INFO_PTR pInfo)
{
	HAP_ENTER();
	CK_RV rv = hapGetInfo(pInfo);
	HAP_LEAVE();
	return rv;
}

CK_RV C_GetSlotList(CK_BBOOL tokenPresent, CK_SLOT_ID_PTR pSlotList, CK_ULONG_PTR pulCount)
{
	HAP_ENTER();
	CK_RV rv = hapGetSlotList(tokenPresent, pSlotList, pulCount);
	HAP_LEAVE();
	return rv;
}

CK_RV C_GetSlotInfo(CK_SLOT_ID slotID, CK_SLOT_INFO_PTR pInfo)
{
	HAP_ENTER();
	CK_RV rv = hapGetSlotInfo(slotID, pInfo);
	HAP_LEAVE();
	return rv;
}

CK_RV C_GetTokenInfo(CK_SLOT_ID slotID, CK_TOKEN_INFO_PTR pInfo)
{
	HAP_ENTER();
	CK_RV rv = hapGetTokenInfo(slotID, pInfo);
	HAP_LEAVE();
	return rv;
}

CK_RV C_GetMechanismList(CK_SLOT_ID slotID, CK_MECHANISM_TYPE_PTR pMechanismList, CK_ULONG_PTR pulCount)
{
	HAP_ENTER();
	CK_RV rv = hapGetMechanismList(slotID, pMechanismList, pulCount);
	HAP_LEAVE();
	return rv;
}

CK_RV C_GetMechanismInfo(CK_SLOT_ID slotID, CK_MECHANISM_TYPE type, CK_MECHANISM_INFO_PTR pInfo)
{
	HAP_ENTER();
	CK_RV rv = hapGetMechanismInfo(slotID, type, pInfo);
	HAP_LEAVE();
	return rv;
}

CK_RV C_InitToken(CK_SLOT_ID slotID, CK_UTF8CHAR_PTR pPin, CK_ULONG ulPinLen, CK_UTF8CHAR_PTR pLabel)
{
	HAP_ENTER();
	CK_RV rv = hapInitToken(slotID, pPin, ulPinLen, pLabel);
	HAP_LEAVE();
	return rv;
}

CK_RV C_InitPIN(CK_SESSION_HANDLE hSession, CK_UTF8CHAR_PTR pPin, CK_ULONG ulPinLen)
{
	HAP_ENTER();
	CK_RV rv = hapInitPIN(hSession, pPin, ulPinLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_SetPIN(CK_SESSION_HANDLE hSession, CK_UTF8CHAR_PTR pOldPin, CK_ULONG ulOldLen, CK_UTF8CHAR_PTR pNewPin, CK_ULONG ulNewLen)
{
	HAP_ENTER();
	CK_RV rv = hapSetPIN(hSession, pOldPin, ulOldLen, pNewPin, ulNewLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_OpenSession(CK_SLOT_ID slotID, CK_FLAGS flags, CK_VOID_PTR pApplication, CK_NOTIFY Notify, CK_SESSION_HANDLE_PTR phSession)
{
	HAP_ENTER();
	CK_RV rv = hapOpenSession(slotID, flags, pApplication, Notify, phSession);
	HAP_LEAVE();
	return rv;
}

CK_RV C_CloseSession(CK_SESSION_HANDLE hSession)
{
	HAP_ENTER();
	CK_RV rv = hapCloseSession(hSession);
	HAP_LEAVE();
	return rv;
}

CK_RV C_CloseAllSessions(CK_SLOT_ID slotID)
{
	HAP_ENTER();
	CK_RV rv = hapCloseAllSessions(slotID);
	HAP_LEAVE();
	return rv;
}

CK_RV C_GetSessionInfo(CK_SESSION_HANDLE hSession, CK_SESSION_INFO_PTR pInfo)
{
	HAP_ENTER();
	CK_RV rv = hapGetSessionInfo(hSession, pInfo);
	HAP_LEAVE();
	return rv;
}

CK_RV C_GetOperationState(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pOperationState, CK_ULONG_PTR pulOperationStateLen)
{
	HAP_ENTER();
	CK_RV rv = hapGetOperationState(hSession, pOperationState, pulOperationStateLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_SetOperationState(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pOperationState, CK_ULONG ulOperationStateLen, CK_OBJECT_HANDLE hEncryptionKey, CK_OBJECT_HANDLE hAuthenticationKey)
{
	HAP_ENTER();
	CK_RV rv = hapSetOperationState(hSession, pOperationState, ulOperationStateLen, hEncryptionKey, hAuthenticationKey);
	HAP_LEAVE();
	return rv;
}

CK_RV C_Login(CK_SESSION_HANDLE hSession, CK_USER_TYPE userType, CK_UTF8CHAR_PTR pPin, CK_ULONG ulPinLen)
{
	HAP_ENTER();
	CK_RV rv = hapLogin(hSession, userType, pPin, ulPinLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_Logout(CK_SESSION_HANDLE hSession)
{
	HAP_ENTER();
	CK_RV rv = hapLogout(hSession);
	HAP_LEAVE();
	return rv;
}

CK_RV C_CreateObject(CK_SESSION_HANDLE hSession, CK_ATTRIBUTE_PTR pTemplate, CK_ULONG ulCount, CK_OBJECT_HANDLE_PTR phObject)
{
	HAP_ENTER();
	CK_RV rv = hapCreateObject(hSession, pTemplate, ulCount, phObject);
	HAP_LEAVE();
	return rv;
}

CK_RV C_CopyObject(CK_SESSION_HANDLE hSession, CK_OBJECT_HANDLE hObject, CK_ATTRIBUTE_PTR pTemplate, CK_ULONG ulCount, CK_OBJECT_HANDLE_PTR phNewObject)
{
	HAP_ENTER();
	CK_RV rv = hapCopyObject(hSession, hObject, pTemplate, ulCount, phNewObject);
	HAP_LEAVE();
	return rv;
}

CK_RV C_DestroyObject(CK_SESSION_HANDLE hSession, CK_OBJECT_HANDLE hObject)
{
	HAP_ENTER();
	CK_RV rv = hapDestroyObject(hSession, hObject);
	HAP_LEAVE();
	return rv;
}

CK_RV C_GetObjectSize(CK_SESSION_HANDLE hSession, CK_OBJECT_HANDLE hObject, CK_ULONG_PTR pulSize)
{
	HAP_ENTER();
	CK_RV rv = hapGetObjectSize(hSession, hObject, pulSize);
	HAP_LEAVE();
	return rv;
}

CK_RV C_GetAttributeValue(CK_SESSION_HANDLE hSession, CK_OBJECT_HANDLE hObject, CK_ATTRIBUTE_PTR pTemplate, CK_ULONG ulCount)
{
	HAP_ENTER();
	CK_RV rv = hapGetAttributeValue(hSession, hObject, pTemplate, ulCount);
	HAP_LEAVE();
	return rv;
}

CK_RV C_SetAttributeValue(CK_SESSION_HANDLE hSession, CK_OBJECT_HANDLE hObject, CK_ATTRIBUTE_PTR pTemplate, CK_ULONG ulCount)
{
	HAP_ENTER();
	CK_RV rv = hapSetAttributeValue(hSession, hObject, pTemplate, ulCount);
	HAP_LEAVE();
	return rv;
}

CK_RV C_FindObjectsInit(CK_SESSION_HANDLE hSession, CK_ATTRIBUTE_PTR pTemplate, CK_ULONG ulCount)
{
	HAP_ENTER();
	CK_RV rv = hapFindObjectsInit(hSession, pTemplate, ulCount);
	HAP_LEAVE();
	return rv;
}

CK_RV C_FindObjects(CK_SESSION_HANDLE hSession, CK_OBJECT_HANDLE_PTR phObject, CK_ULONG ulMaxObjectCount, CK_ULONG_PTR pulObjectCount)
{
	HAP_ENTER();
	CK_RV rv = hapFindObjects(hSession, phObject, ulMaxObjectCount, pulObjectCount);
	HAP_LEAVE();
	return rv;
}

CK_RV C_FindObjectsFinal(CK_SESSION_HANDLE hSession)
{
	HAP_ENTER();
	CK_RV rv = hapFindObjectsFinal(hSession);
	HAP_LEAVE();
	return rv;
}

CK_RV C_EncryptInit(CK_SESSION_HANDLE hSession, CK_MECHANISM_PTR pMechanism, CK_OBJECT_HANDLE hKey)
{
	HAP_ENTER();
	CK_RV rv = hapEncryptInit(hSession, pMechanism, hKey);
	HAP_LEAVE();
	return rv;
}

CK_RV C_Encrypt(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pData, CK_ULONG ulDataLen, CK_BYTE_PTR pEncryptedData, CK_ULONG_PTR pulEncryptedDataLen)
{
	HAP_ENTER();
	CK_RV rv = hapEncrypt(hSession, pData, ulDataLen, pEncryptedData, pulEncryptedDataLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_EncryptUpdate(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pPart, CK_ULONG ulPartLen, CK_BYTE_PTR pEncryptedPart, CK_ULONG_PTR pulEncryptedPartLen)
{
	HAP_ENTER();
	CK_RV rv = hapEncryptUpdate(hSession, pPart, ulPartLen, pEncryptedPart, pulEncryptedPartLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_EncryptFinal(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pLastEncryptedPart, CK_ULONG_PTR pulLastEncryptedPartLen)
{
	HAP_ENTER();
	CK_RV rv = hapEncryptFinal(hSession, pLastEncryptedPart, pulLastEncryptedPartLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_DecryptInit(CK_SESSION_HANDLE hSession, CK_MECHANISM_PTR pMechanism, CK_OBJECT_HANDLE hKey)
{
	HAP_ENTER();
	CK_RV rv = hapDecryptInit(hSession, pMechanism, hKey);
	HAP_LEAVE();
	return rv;
}

CK_RV C_Decrypt(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pEncryptedData, CK_ULONG ulEncryptedDataLen, CK_BYTE_PTR pData, CK_ULONG_PTR pulDataLen)
{
	HAP_ENTER();
	CK_RV rv = hapDecrypt(hSession, pEncryptedData, ulEncryptedDataLen, pData, pulDataLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_DecryptUpdate(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pEncryptedPart, CK_ULONG ulEncryptedPartLen, CK_BYTE_PTR pPart, CK_ULONG_PTR pulPartLen)
{
	HAP_ENTER();
	CK_RV rv = hapDecryptUpdate(hSession, pEncryptedPart, ulEncryptedPartLen, pPart, pulPartLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_DecryptFinal(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pLastPart, CK_ULONG_PTR pulLastPartLen)
{
	HAP_ENTER();
	CK_RV rv = hapDecryptFinal(hSession, pLastPart, pulLastPartLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_DigestInit(CK_SESSION_HANDLE hSession, CK_MECHANISM_PTR pMechanism)
{
	HAP_ENTER();
	CK_RV rv = hapDigestInit(hSession, pMechanism);
	HAP_LEAVE();
	return rv;
}

CK_RV C_Digest(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pData, CK_ULONG ulDataLen, CK_BYTE_PTR pDigest, CK_ULONG_PTR pulDigestLen)
{
	HAP_ENTER();
	CK_RV rv = hapDigest(hSession, pData, ulDataLen, pDigest, pulDigestLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_DigestUpdate(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pPart, CK_ULONG ulPartLen)
{
	HAP_ENTER();
	CK_RV rv = hapDigestUpdate(hSession, pPart, ulPartLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_DigestKey(CK_SESSION_HANDLE hSession, CK_OBJECT_HANDLE hKey)
{
	HAP_ENTER();
	CK_RV rv = hapDigestKey(hSession, hKey);
	HAP_LEAVE();
	return rv;
}

CK_RV C_DigestFinal(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pDigest, CK_ULONG_PTR pulDigestLen)
{
	HAP_ENTER();
	CK_RV rv = hapDigestFinal(hSession, pDigest, pulDigestLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_SignInit(CK_SESSION_HANDLE hSession, CK_MECHANISM_PTR pMechanism, CK_OBJECT_HANDLE hKey)
{
	HAP_ENTER();
	CK_RV rv = hapSignInit(hSession, pMechanism, hKey);
	HAP_LEAVE();
	return rv;
}

CK_RV C_Sign(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pData, CK_ULONG ulDataLen, CK_BYTE_PTR pSignature, CK_ULONG_PTR pulSignatureLen)
{
	HAP_ENTER();
	CK_RV rv = hapSign(hSession, pData, ulDataLen, pSignature, pulSignatureLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_SignUpdate(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pPart, CK_ULONG ulPartLen)
{
	HAP_ENTER();
	CK_RV rv = hapSignUpdate(hSession, pPart, ulPartLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_SignFinal(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pSignature, CK_ULONG_PTR pulSignatureLen)
{
	HAP_ENTER();
	CK_RV rv = hapSignFinal(hSession, pSignature, pulSignatureLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_SignRecoverInit(CK_SESSION_HANDLE hSession, CK_MECHANISM_PTR pMechanism, CK_OBJECT_HANDLE hKey)
{
	HAP_ENTER();
	CK_RV rv = hapSignRecoverInit(hSession, pMechanism, hKey);
	HAP_LEAVE();
	return rv;
}

CK_RV C_SignRecover(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pData, CK_ULONG ulDataLen, CK_BYTE_PTR pSignature, CK_ULONG_PTR pulSignatureLen)
{
	HAP_ENTER();
	CK_RV rv = hapSignRecover(hSession, pData, ulDataLen, pSignature, pulSignatureLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_VerifyInit(CK_SESSION_HANDLE hSession, CK_MECHANISM_PTR pMechanism, CK_OBJECT_HANDLE hKey)
{
	HAP_ENTER();
	CK_RV rv = hapVerifyInit(hSession, pMechanism, hKey);
	HAP_LEAVE();
	return rv;
}

CK_RV C_Verify(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pData, CK_ULONG ulDataLen, CK_BYTE_PTR pSignature, CK_ULONG ulSignatureLen)
{
	HAP_ENTER();
	CK_RV rv = hapVerify(hSession, pData, ulDataLen, pSignature, ulSignatureLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_VerifyUpdate(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pPart, CK_ULONG ulPartLen)
{
	HAP_ENTER();
	CK_RV rv = hapVerifyUpdate(hSession, pPart, ulPartLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_VerifyFinal(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pSignature, CK_ULONG ulSignatureLen)
{
	HAP_ENTER();
	CK_RV rv = hapVerifyFinal(hSession, pSignature, ulSignatureLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_VerifyRecoverInit(CK_SESSION_HANDLE hSession, CK_MECHANISM_PTR pMechanism, CK_OBJECT_HANDLE hKey)
{
	HAP_ENTER();
	CK_RV rv = hapVerifyRecoverInit(hSession, pMechanism, hKey);
	HAP_LEAVE();
	return rv;
}

CK_RV C_VerifyRecover(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pSignature, CK_ULONG ulSignatureLen, CK_BYTE_PTR pData, CK_ULONG_PTR pulDataLen)
{
	HAP_ENTER();
	CK_RV rv = hapVerifyRecover(hSession, pSignature, ulSignatureLen, pData, pulDataLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_DigestEncryptUpdate(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pPart, CK_ULONG ulPartLen, CK_BYTE_PTR pEncryptedPart, CK_ULONG_PTR pulEncryptedPartLen)
{
	HAP_ENTER();
	CK_RV rv = hapDigestEncryptUpdate(hSession, pPart, ulPartLen, pEncryptedPart, pulEncryptedPartLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_DecryptDigestUpdate(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pEncryptedPart, CK_ULONG ulEncryptedPartLen, CK_BYTE_PTR pPart, CK_ULONG_PTR pulPartLen)
{
	HAP_ENTER();
	CK_RV rv = hapDecryptDigestUpdate(hSession, pEncryptedPart, ulEncryptedPartLen, pPart, pulPartLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_SignEncryptUpdate(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pPart, CK_ULONG ulPartLen, CK_BYTE_PTR pEncryptedPart, CK_ULONG_PTR pulEncryptedPartLen)
{
	HAP_ENTER();
	CK_RV rv = hapSignEncryptUpdate(hSession, pPart, ulPartLen, pEncryptedPart, pulEncryptedPartLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_DecryptVerifyUpdate(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pEncryptedPart, CK_ULONG ulEncryptedPartLen, CK_BYTE_PTR pPart, CK_ULONG_PTR pulPartLen)
{
	HAP_ENTER();
	CK_RV rv = hapDecryptVerifyUpdate(hSession, pEncryptedPart, ulEncryptedPartLen, pPart, pulPartLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_GenerateKey(CK_SESSION_HANDLE hSession, CK_MECHANISM_PTR pMechanism, CK_ATTRIBUTE_PTR pTemplate, CK_ULONG ulCount, CK_OBJECT_HANDLE_PTR phKey)
{
	HAP_ENTER();
	CK_RV rv = hapGenerateKey(hSession, pMechanism, pTemplate, ulCount, phKey);
	HAP_LEAVE();
	return rv;
}

CK_RV C_GenerateKeyPair(CK_SESSION_HANDLE hSession, CK_MECHANISM_PTR pMechanism, CK_ATTRIBUTE_PTR pPublicKeyTemplate, CK_ULONG ulPublicKeyAttributeCount, CK_ATTRIBUTE_PTR pPrivateKeyTemplate, CK_ULONG ulPrivateKeyAttributeCount, CK_OBJECT_HANDLE_PTR phPublicKey, CK_OBJECT_HANDLE_PTR phPrivateKey)
{
	HAP_ENTER();
	CK_RV rv = hapGenerateKeyPair(hSession, pMechanism, pPublicKeyTemplate, ulPublicKeyAttributeCount, pPrivateKeyTemplate, ulPrivateKeyAttributeCount, phPublicKey, phPrivateKey);
	HAP_LEAVE();
	return rv;
}

CK_RV C_WrapKey(CK_SESSION_HANDLE hSession, CK_MECHANISM_PTR pMechanism, CK_OBJECT_HANDLE hWrappingKey, CK_OBJECT_HANDLE hKey, CK_BYTE_PTR pWrappedKey, CK_ULONG_PTR pulWrappedKeyLen)
{
	HAP_ENTER();
	CK_RV rv = hapWrapKey(hSession, pMechanism, hWrappingKey, hKey, pWrappedKey, pulWrappedKeyLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_UnwrapKey(CK_SESSION_HANDLE hSession, CK_MECHANISM_PTR pMechanism, CK_OBJECT_HANDLE hUnwrappingKey, CK_BYTE_PTR pWrappedKey, CK_ULONG ulWrappedKeyLen, CK_ATTRIBUTE_PTR pTemplate, CK_ULONG ulAttributeCount, CK_OBJECT_HANDLE_PTR phKey)
{
	HAP_ENTER();
	CK_RV rv = hapUnwrapKey(hSession, pMechanism, hUnwrappingKey, pWrappedKey, ulWrappedKeyLen, pTemplate, ulAttributeCount, phKey);
	HAP_LEAVE();
	return rv;
}

CK_RV C_DeriveKey(CK_SESSION_HANDLE hSession, CK_MECHANISM_PTR pMechanism, CK_OBJECT_HANDLE hBaseKey, CK_ATTRIBUTE_PTR pTemplate, CK_ULONG ulAttributeCount, CK_OBJECT_HANDLE_PTR phKey)
{
	HAP_ENTER();
	CK_RV rv = hapDeriveKey(hSession, pMechanism, hBaseKey, pTemplate, ulAttributeCount, phKey);
	HAP_LEAVE();
	return rv;
}

CK_RV C_SeedRandom(CK_SESSION_HANDLE hSession, CK_BYTE_PTR pSeed, CK_ULONG ulSeedLen)
{
	HAP_ENTER();
	CK_RV rv = hapSeedRandom(hSession, pSeed, ulSeedLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_GenerateRandom(CK_SESSION_HANDLE hSession, CK_BYTE_PTR RandomData, CK_ULONG ulRandomLen)
{
	HAP_ENTER();
	CK_RV rv = hapGenerateRandom(hSession, RandomData, ulRandomLen);
	HAP_LEAVE();
	return rv;
}

CK_RV C_GetFunctionStatus(CK_SESSION_HANDLE hSession)
{
	HAP_ENTER();
	CK_RV rv = hapGetFunctionStatus(hSession);
	HAP_LEAVE();
	return rv;
}

CK_RV C_CancelFunction(CK_SESSION_HANDLE hSession)
{
	HAP_ENTER();
	CK_RV rv = hapCancelFunction(hSession);
	HAP_LEAVE();
	return rv;
}

CK_RV C_WaitForSlotEvent(CK_FLAGS flags, CK_SLOT_ID_PTR pSlot, CK_VOID_PTR pRserved)
{
	HAP_ENTER();
	CK_RV rv = hapWaitForSlotEvent(flags, pSlot, pRserved);
	HAP_LEAVE();
	return rv;
}
