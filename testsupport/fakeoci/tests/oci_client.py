"""Runs the official OCI Python SDK against the fake Object Storage, for tests/oci_sdk.rs.

argv[1]: a JSON file {"endpoint", "bucket", "prefix", "tenancy", "user", "fingerprint", "key_file",
"wrong_key_file", "range": [first, last]}.
Prints one JSON object: {"version", "namespace", "listing": [{name, size, md5, etag}], "objects": {name:
{"head": {header: value}, "md5_hex", "size", "range": {"status", "content_range", "hex"}}}, "wrong_key":
{"status", "code"}, "rate_limited": {"status"}, "instance_principal": {"tenancy", "listed"}}.
"""

import hashlib
import json
import os
import sys
import urllib.request

import oci
from oci.exceptions import ServiceError
from oci.retry import NoneRetryStrategy

HEAD_HEADERS = ["content-length", "content-md5", "etag", "opc-multipart-md5", "opc-meta-md5", "opc-request-id"]
CHUNK_BYTES = 1 << 20
PAGES_MAX = 100


def client(spec, key_file):
    # The SDK's usual path: a config validated by the SDK, from which it builds its own Signer.
    config = {
        "tenancy": spec["tenancy"],
        "user": spec["user"],
        "fingerprint": spec["fingerprint"],
        "key_file": key_file,
        "region": "us-ashburn-1",
    }
    oci.config.validate_config(config)
    return oci.object_storage.ObjectStorageClient(config, service_endpoint=spec["endpoint"])


def listing(storage, namespace, spec):
    """Follows next_start_with until the last page (as OME's Go code does with NextStartWith)."""
    objects, start = [], None
    for _ in range(PAGES_MAX):
        page = storage.list_objects(
            namespace, spec["bucket"], prefix=spec["prefix"], start=start, fields="name,size,md5,etag"
        ).data
        objects += [{"name": o.name, "size": o.size, "md5": o.md5, "etag": o.etag} for o in page.objects]
        start = page.next_start_with
        if start is None:
            return objects
    raise RuntimeError(f"more than {PAGES_MAX} pages")


def read_object(storage, namespace, bucket, name, byte_range):
    head = storage.head_object(namespace, bucket, name)
    whole = storage.get_object(namespace, bucket, name)
    digest, size = hashlib.md5(), 0
    for chunk in whole.data.raw.stream(CHUNK_BYTES, decode_content=False):
        digest.update(chunk)
        size += len(chunk)
    first, last = byte_range
    part = storage.get_object(namespace, bucket, name, range=f"bytes={first}-{last}")
    return {
        "head": {h: head.headers.get(h) for h in HEAD_HEADERS},
        "md5_hex": digest.hexdigest(),
        "size": size,
        "range": {"status": part.status, "content_range": part.headers.get("content-range"), "hex": part.data.content.hex()},
    }


def refused(call):
    try:
        call()
    except ServiceError as error:
        return {"status": error.status, "code": error.code}
    return {"status": 200, "code": None}


def rate_limited_then_served(storage, namespace, spec, name):
    """Arms one 429 through the admin endpoint; the SDK's default retry strategy must retry it."""
    fault = json.dumps({"kind": "rate_limit", "count": 1, "retry_after_s": 1}).encode()
    admin = urllib.request.Request(spec["endpoint"] + "/_fakeoci/faults", data=fault, method="POST")
    admin.add_header("content-type", "application/json")
    urllib.request.urlopen(admin).read()
    return {"status": storage.head_object(namespace, spec["bucket"], name).status}


def instance_principal(spec):
    """The SDK's InstancePrincipalsSecurityTokenSigner through the fake's metadata (OCI_METADATA_BASE_URL)
    and federation services; then a listing signed with its session token."""
    os.environ["OCI_METADATA_BASE_URL"] = spec["endpoint"] + "/opc/v2"
    signer = oci.auth.signers.InstancePrincipalsSecurityTokenSigner(
        federation_endpoint=spec["endpoint"] + "/v1/x509")
    storage = oci.object_storage.ObjectStorageClient({}, signer=signer, service_endpoint=spec["endpoint"])
    page = storage.list_objects(storage.get_namespace().data, spec["bucket"], prefix=spec["prefix"]).data
    return {"tenancy": signer.tenancy_id, "listed": len(page.objects)}


def main():
    with open(sys.argv[1]) as spec_file:
        spec = json.load(spec_file)
    storage = client(spec, spec["key_file"])
    namespace = storage.get_namespace().data
    objects = listing(storage, namespace, spec)
    read = {o["name"]: read_object(storage, namespace, spec["bucket"], o["name"], spec["range"]) for o in objects}
    wrong = client(spec, spec["wrong_key_file"])
    no_retry = NoneRetryStrategy()
    wrong_key = refused(lambda: wrong.list_objects(namespace, spec["bucket"], retry_strategy=no_retry))
    result = {
        "version": oci.__version__,
        "namespace": namespace,
        "listing": objects,
        "objects": read,
        "wrong_key": wrong_key,
        "rate_limited": rate_limited_then_served(storage, namespace, spec, objects[0]["name"]),
        "instance_principal": instance_principal(spec),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
