"""Writes the fake instance identity the fake metadata service serves (run once; the files are committed):
instance-intermediate.pem (a self-signed CA standing in for OCI's identity intermediate), instance-cert.pem
(the instance's leaf certificate, issued by it, with OCI's subject attributes: opc-tenant, opc-instance, ...)
and instance-key.pem (its key, PKCS#1). For tests only: never use them anywhere real.
Needs the `cryptography` package (scripts/py-oci's venv has it):
  ~/.cache/model-agent-py-oci/venv/bin/python keys/make-instance-identity.py keys/
"""
import datetime
import sys

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

TENANCY = "ocid1.tenancy.oc1..aaaaaaaafakeocitenancy0000000000000000000000000000000000"
INSTANCE = "ocid1.instance.oc1.iad.aaaaaaaafakeociinstance00000000000000000000000000000000"
COMPARTMENT = "ocid1.compartment.oc1..aaaaaaaafakeocicompartment000000000000000000000000000"


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def main(out):
    start = datetime.datetime(2025, 1, 1, tzinfo=datetime.timezone.utc)
    end = datetime.datetime(2125, 1, 1, tzinfo=datetime.timezone.utc)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "PKISVC Identity Intermediate (fakeoci)")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(1).not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ou = NameOID.ORGANIZATIONAL_UNIT_NAME
    subject = x509.Name([
        # OCI's common names are OCIDs, longer than X.520's 64-character bound.
        x509.NameAttribute(NameOID.COMMON_NAME, INSTANCE, _validate=False),
        x509.NameAttribute(ou, "opc-certtype:instance"),
        x509.NameAttribute(ou, "opc-compartment:" + COMPARTMENT),
        x509.NameAttribute(ou, "opc-instance:" + INSTANCE),
        x509.NameAttribute(ou, "opc-tenant:" + TENANCY),
    ])
    leaf = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name).public_key(key.public_key())
        .serial_number(2).not_valid_before(start).not_valid_after(end)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    write(out + "/instance-intermediate.pem", ca.public_bytes(pem))
    write(out + "/instance-cert.pem", leaf.public_bytes(pem))
    write(out + "/instance-key.pem", key.private_bytes(
        pem, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()))


if __name__ == "__main__":
    main(sys.argv[1])
