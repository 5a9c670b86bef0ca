//! RSA keys as OCI API keys use them: PEM private keys (PKCS#8 or PKCS#1), the public key as
//! SubjectPublicKeyInfo PEM, and the key's fingerprint (MD5 of the DER public key, as the console shows).
//! Also the test keys this crate ships (generated once with openssl; never used anywhere real).

use md5::{Digest, Md5};
use ring::rand::SystemRandom;
use ring::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{PrivateKeyDer, SubjectPublicKeyInfoDer};

/// The test key pair: `PRIVATE_KEY_PEM` (PKCS#8), the same key as PKCS#1 and encrypted (passphrase
/// `secret`), its public key, and a second, unrelated private key.
pub mod test_keys {
    pub const PRIVATE_KEY_PEM: &str = include_str!("../keys/test-key.pem");
    pub const PRIVATE_KEY_PKCS1_PEM: &str = include_str!("../keys/test-key.pkcs1.pem");
    pub const ENCRYPTED_PRIVATE_KEY_PEM: &str = include_str!("../keys/test-key.encrypted.pem");
    pub const PUBLIC_KEY_PEM: &str = include_str!("../keys/test-key.pub.pem");
    pub const OTHER_PRIVATE_KEY_PEM: &str = include_str!("../keys/other-key.pem");
    /// `openssl pkey -in keys/test-key.pem -pubout -outform DER | openssl md5 -c`
    pub const FINGERPRINT: &str = "c7:c0:98:83:b4:4d:0c:b3:c6:51:e5:74:c5:d0:e5:cd";
    pub const TENANCY: &str = "ocid1.tenancy.oc1..aaaaaaaafakeocitenancy0000000000000000000000000000000000";
    pub const USER: &str = "ocid1.user.oc1..aaaaaaaafakeociuser000000000000000000000000000000000000000";
}

/// A public key the fake checks signatures with.
#[derive(Clone, Debug)]
pub struct PublicKey {
    /// PKCS#1 `RSAPublicKey` DER, what ring verifies with.
    pub(crate) pkcs1_der: Vec<u8>,
    /// `aa:bb:…`: MD5 of the SubjectPublicKeyInfo DER.
    pub fingerprint: String,
}

impl PublicKey {
    /// A `-----BEGIN PUBLIC KEY-----` PEM (SubjectPublicKeyInfo, as `openssl pkey -pubout` writes it).
    pub fn from_pem(pem: &str) -> Result<PublicKey, String> {
        let spki = SubjectPublicKeyInfoDer::from_pem_slice(pem.as_bytes())
            .map_err(|e| format!("public key: not a PUBLIC KEY PEM: {e:?}"))?;
        let pkcs1_der = rsa_public_key_of_spki(spki.as_ref()).ok_or("public key: not an RSA SubjectPublicKeyInfo")?;
        Ok(PublicKey { pkcs1_der, fingerprint: fingerprint_of_spki(spki.as_ref()) })
    }
}

/// The fingerprint OCI shows for an API key: MD5 of the DER SubjectPublicKeyInfo, colon-separated hex.
pub fn fingerprint_of_spki(spki_der: &[u8]) -> String {
    let digest = Md5::digest(spki_der);
    digest.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

/// A signing key for the fake's own tests and tools (the agent has its own signer).
pub struct PrivateKey(RsaKeyPair);

impl PrivateKey {
    /// An unencrypted PKCS#8 (`PRIVATE KEY`) or PKCS#1 (`RSA PRIVATE KEY`) PEM.
    pub fn from_pem(pem: &str) -> Result<PrivateKey, String> {
        let der = PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| format!("private key: {e:?}"))?;
        let pair = match der {
            PrivateKeyDer::Pkcs8(der) => RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()),
            PrivateKeyDer::Pkcs1(der) => RsaKeyPair::from_der(der.secret_pkcs1_der()),
            _ => return Err("private key: not RSA".into()),
        };
        Ok(PrivateKey(pair.map_err(|e| format!("private key: {e}"))?))
    }

    /// RSASSA-PKCS1-v1_5 with SHA-256 over `message`.
    pub fn sign(&self, message: &[u8]) -> Vec<u8> {
        let mut signature = vec![0; self.0.public().modulus_len()];
        self.0.sign(&RSA_PKCS1_SHA256, &SystemRandom::new(), message, &mut signature).expect("RSA signing");
        signature
    }
}

/// One DER element: (tag, contents, what follows). Definite lengths only (DER has no others).
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let count = (first & 0x7f) as usize;
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let len = rest[..count].iter().fold(0usize, |acc, b| (acc << 8) | *b as usize);
        (len, &rest[count..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The 1.2.840.113549.1.1.1 (rsaEncryption) OID's contents.
const RSA_ENCRYPTION_OID: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];

/// `SEQUENCE { SEQUENCE { rsaEncryption, NULL }, BIT STRING { 0, RSAPublicKey } }` → RSAPublicKey.
fn rsa_public_key_of_spki(spki: &[u8]) -> Option<Vec<u8>> {
    let (0x30, body, _) = der_element(spki)? else { return None };
    let (0x30, algorithm, rest) = der_element(body)? else { return None };
    let (0x06, oid, _) = der_element(algorithm)? else { return None };
    if oid != RSA_ENCRYPTION_OID {
        return None;
    }
    let (0x03, bits, _) = der_element(rest)? else { return None };
    let (0, key) = bits.split_first()? else { return None };
    Some(key.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{RSA_PKCS1_2048_8192_SHA256, UnparsedPublicKey};

    #[test]
    fn the_test_keys_agree_with_openssl() {
        let public = PublicKey::from_pem(test_keys::PUBLIC_KEY_PEM).unwrap();
        assert_eq!(public.fingerprint, test_keys::FINGERPRINT);
        for pem in [test_keys::PRIVATE_KEY_PEM, test_keys::PRIVATE_KEY_PKCS1_PEM] {
            let signature = PrivateKey::from_pem(pem).unwrap().sign(b"message");
            let verifier = UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, &public.pkcs1_der);
            assert!(verifier.verify(b"message", &signature).is_ok());
        }
        let other = PrivateKey::from_pem(test_keys::OTHER_PRIVATE_KEY_PEM).unwrap().sign(b"message");
        let verifier = UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, &public.pkcs1_der);
        assert!(verifier.verify(b"message", &other).is_err());
        assert!(PrivateKey::from_pem(test_keys::ENCRYPTED_PRIVATE_KEY_PEM).is_err());
    }

    #[test]
    fn der_lengths_in_long_form_read() {
        let mut long = vec![0x04, 0x81, 200];
        long.extend(std::iter::repeat_n(7u8, 200));
        let (tag, body, rest) = der_element(&long).unwrap();
        assert_eq!((tag, body.len(), rest.len()), (4, 200, 0));
        assert!(der_element(&[0x04, 0x05, 1, 2]).is_none());
    }
}
