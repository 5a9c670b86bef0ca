"""Runs the real huggingface_hub against the fake Hub, for tests/huggingface_hub.rs.

argv[1]: a JSON file {"endpoint", "downloads": [{name, repo, revision, token, local_dir}], "tree": {repo, revision}}.
Prints one JSON object: {"version", "downloads": {name: {"ok": path} | {"error": class, "bases": [...]}},
"tree": [entries]}.
"""

import json
import sys

import huggingface_hub
from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.hf_api import RepoFile


def download(endpoint, case):
    try:
        path = snapshot_download(
            case["repo"],
            revision=case["revision"],
            endpoint=endpoint,
            # False, not None: no token from the environment or a token file.
            token=case["token"] or False,
            local_dir=case["local_dir"],
            max_workers=4,
        )
        return {"ok": path}
    except Exception as error:  # the test checks which one
        bases = [cls.__name__ for cls in type(error).__mro__]
        return {"error": type(error).__name__, "bases": bases, "message": str(error)[:500]}


def tree_entry(entry):
    if isinstance(entry, RepoFile):
        lfs = None
        if entry.lfs is not None:
            lfs = {"sha256": entry.lfs.sha256, "size": entry.lfs.size, "pointer_size": entry.lfs.pointer_size}
        return {"type": "file", "path": entry.path, "size": entry.size, "blob_id": entry.blob_id, "lfs": lfs}
    return {"type": "directory", "path": entry.path, "tree_id": entry.tree_id}


def main():
    with open(sys.argv[1]) as spec_file:
        spec = json.load(spec_file)
    endpoint = spec["endpoint"]
    downloads = {case["name"]: download(endpoint, case) for case in spec["downloads"]}
    tree = spec["tree"]
    api = HfApi(endpoint=endpoint, token=False)
    entries = api.list_repo_tree(tree["repo"], revision=tree["revision"], recursive=True)
    result = {
        "version": huggingface_hub.__version__,
        "downloads": downloads,
        "tree": [tree_entry(entry) for entry in entries],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
