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
    /// The fake instance's identity (`keys/make-instance-identity.py`): its certificate (subject
    /// `OU=opc-tenant:` `TENANCY`, issued by `INSTANCE_INTERMEDIATE_PEM`) and its key (PKCS#1).
    pub const INSTANCE_CERT_PEM: &str = include_str!("../keys/instance-cert.pem");
    pub const INSTANCE_KEY_PEM: &str = include_str!("../keys/instance-key.pem");
    pub const INSTANCE_INTERMEDIATE_PEM: &str = include_str!("../keys/instance-intermediate.pem");
    /// `openssl x509 -in keys/instance-cert.pem -noout -fingerprint -sha256`, lowercase.
    pub const INSTANCE_CERT_SHA256: &str =
        "09:2c:51:38:72:ef:7b:3c:ca:34:d9:96:71:73:a6:da:31:ee:59:40:66:67:a5:3d:21:b1:50:ce:e8:fd:eb:92";
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
        PublicKey::from_spki_der(spki.as_ref())
    }

    /// A DER SubjectPublicKeyInfo (what a certificate holds, and what the federation request sends).
    pub fn from_spki_der(spki: &[u8]) -> Result<PublicKey, String> {
        let pkcs1_der = rsa_public_key_of_spki(spki).ok_or("public key: not an RSA SubjectPublicKeyInfo")?;
        Ok(PublicKey { pkcs1_der, fingerprint: fingerprint_of_spki(spki) })
    }
}

/// What the fake federation reads from an X.509 certificate (DER): its public key and the text
/// values of its subject's attributes (`CN`, every `OU`, …), in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertificateParts {
    pub spki_der: Vec<u8>,
    pub subject_values: Vec<String>,
}

/// `Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version?, serial, signature, issuer,
/// validity, subject, subjectPublicKeyInfo, … }, … }`.
pub fn certificate_parts(der: &[u8]) -> Option<CertificateParts> {
    let (0x30, certificate, _, _) = der_tlv(der)? else { return None };
    let (0x30, tbs, _, _) = der_tlv(certificate)? else { return None };
    let (tag, _, _, mut rest) = der_tlv(tbs)?;
    if tag == 0xa0 {
        rest = der_tlv(rest)?.3; // the version was first: the serial follows
    }
    for _ in 0..3 {
        rest = der_tlv(rest)?.3; // signature, issuer, validity
    }
    let (0x30, subject, _, rest) = der_tlv(rest)? else { return None };
    let (0x30, _, spki, _) = der_tlv(rest)? else { return None };
    Some(CertificateParts { spki_der: spki.to_vec(), subject_values: name_values(subject)? })
}

/// `SEQUENCE OF SET OF SEQUENCE { type OID, value string }`: the values that are strings.
fn name_values(mut rdns: &[u8]) -> Option<Vec<String>> {
    const STRING_TAGS: [u8; 4] = [0x0c, 0x13, 0x14, 0x16]; // UTF8, Printable, Teletex, IA5
    let mut values = Vec::new();
    while !rdns.is_empty() {
        let (0x31, mut set, _, next) = der_tlv(rdns)? else { return None };
        while !set.is_empty() {
            let (0x30, attribute, _, more) = der_tlv(set)? else { return None };
            let (0x06, _, _, value) = der_tlv(attribute)? else { return None };
            let (tag, text, _, _) = der_tlv(value)?;
            if STRING_TAGS.contains(&tag) {
                values.push(String::from_utf8_lossy(text).into_owned());
            }
            set = more;
        }
        rdns = next;
    }
    Some(values)
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
    der_tlv(input).map(|(tag, contents, _, rest)| (tag, contents, rest))
}

/// One DER element: (tag, contents, the whole element, what follows).
type Tlv<'a> = (u8, &'a [u8], &'a [u8], &'a [u8]);

fn der_tlv(input: &[u8]) -> Option<Tlv<'_>> {
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
    let header_len = input.len() - rest.len();
    (rest.len() >= len).then(|| (tag, &rest[..len], &input[..header_len + len], &rest[len..]))
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
    fn the_instance_certificate_gives_its_key_and_subject() {
        let der = rustls_pki_types::CertificateDer::from_pem_slice(test_keys::INSTANCE_CERT_PEM.as_bytes()).unwrap();
        let parts = certificate_parts(der.as_ref()).unwrap();
        let tenant = format!("opc-tenant:{}", test_keys::TENANCY);
        assert!(parts.subject_values.contains(&tenant), "{:?}", parts.subject_values);
        assert!(parts.subject_values[0].starts_with("ocid1.instance."), "the CN first");
        let key = PublicKey::from_spki_der(&parts.spki_der).unwrap();
        let signature = PrivateKey::from_pem(test_keys::INSTANCE_KEY_PEM).unwrap().sign(b"m");
        let verifier = UnparsedPublicKey::new(&RSA_PKCS1_2048_8192_SHA256, &key.pkcs1_der);
        assert!(verifier.verify(b"m", &signature).is_ok());
        assert!(certificate_parts(&der.as_ref()[..100]).is_none());
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
