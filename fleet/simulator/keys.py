"""The account's SSH keys and the ones attached to each instance, as vast.ai's /ssh/ and /instances/{id}/ssh/ routes
keep them (docs/fleet.md, "fleet/simulator/keys.py")."""

import re
from datetime import UTC, datetime

from .account import USER_ID

KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
             "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")
_KEY = re.compile(r"(\S+) ([A-Za-z0-9+/=]{16,8192})( [^\n]{0,512})?")


class SshKeyError(ValueError):
    """A key vast.ai would refuse: not an OpenSSH public key, or a private one."""


def checked(text) -> str:
    """The public key, trimmed; SshKeyError when it is not one line of a known OpenSSH public key type."""
    if not isinstance(text, str) or not text.strip():
        raise SshKeyError("ssh_key must be an OpenSSH public key (the .pub file's line)")
    text = text.strip()
    if "PRIVATE KEY" in text:
        raise SshKeyError("that is a private key: send the public one (the .pub file)")
    found = _KEY.fullmatch(text)
    if found is None or found.group(1) not in KEY_TYPES:
        raise SshKeyError(f"ssh_key must be an OpenSSH public key of type {', '.join(KEY_TYPES[:3])}, ...")
    return text


class SshKeys:
    """Keys by id, and per instance the keys attached to it (by key id); used under the market's lock."""

    def __init__(self, first_id: int = 1000):
        self._next = first_id
        self.keys: dict[int, dict] = {}
        self.attached: dict[int, list[int]] = {}

    def add(self, text: str) -> dict:
        key_id, self._next = self._next, self._next + 1
        key = {"id": key_id, "user_id": USER_ID, "public_key": checked(text),
               "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "deleted_at": None}
        self.keys[key_id] = key
        return key

    def listing(self) -> list[dict]:
        """`GET /ssh/`: as vast.ai documents it, each key under `key`."""
        return [{"id": k["id"], "user_id": k["user_id"], "key": k["public_key"], "created_at": k["created_at"],
                 "deleted_at": None} for k in self.keys.values()]

    def update(self, key_id: int, text: str) -> bool:
        if key_id not in self.keys:
            return False
        self.keys[key_id]["public_key"] = checked(text)
        return True

    def delete(self, key_id: int) -> bool:
        return self.keys.pop(key_id, None) is not None

    def attach(self, instance_id: int, text: str) -> int:
        """The key's id (an account key of the same text, or a new one added to the account as vast.ai does)."""
        text = checked(text)
        key_id = next((k["id"] for k in self.keys.values() if k["public_key"] == text), None)
        if key_id is None:
            key_id = self.add(text)["id"]
        on = self.attached.setdefault(instance_id, [])
        if key_id not in on:
            on.append(key_id)
        return key_id

    def detach(self, instance_id: int, key_id: int) -> bool:
        on = self.attached.get(instance_id, [])
        if key_id not in on:
            return False
        on.remove(key_id)
        return True

    def of(self, instance_id: int) -> list[str]:
        return [self.keys[k]["public_key"] for k in self.attached.get(instance_id, []) if k in self.keys]
