"""What names a device on the cluster: its measurement key (docs/cluster.md#device-keys).

A device advertises its key as a Ray custom resource; a build asks Ray for an actor that needs one unit of
the key of its target, so Ray places it on a matching device. Both sides derive the key here, from what
both know: what the code is for (for a CPU: the triple, the LLVM CPU name and the features the code sees,
so `-mcpu=native` and the host CPU's own name are one key), the cores the kernels are tuned for, and
whether the device measures for real or under qemu.
"""

from __future__ import annotations

import hashlib

from aotc.target import Target, code_features

__all__ = ["KEY_PREFIX", "DeviceKey", "device_key"]

KEY_PREFIX = "aotc-device:"


class DeviceKey(str):
    """A device key (`aotc-device:<12 hex digits>`) that remembers what it was derived from."""

    what: str

    def __new__(cls, value: str, what: str) -> DeviceKey:
        key = super().__new__(cls, value)
        key.what = what
        return key


def device_key(target: Target, emulated: bool = False) -> DeviceKey:
    """The key of a device that measures `target`: a hash of what its code is for (a CPU's triple, LLVM
    CPU name and features as the code sees them, `code_features`, however the target spells them; a
    GPU's target string), the cores its kernels are tuned for (`target.hw.num_cores`: the machine's own
    unless the target says `-num-cores`), and `emulated` for a device that runs the target's code under
    qemu (its timings mean nothing)."""
    tail = f" | {target.hw.num_cores} cores" + (" | emulated" if emulated else "")
    code = str(target)
    if target.is_cpu:
        code = f"llvm {target.triple} {target.mcpu} {','.join(sorted(code_features(target)))}"
    digest = hashlib.sha256((code + tail).encode()).hexdigest()[:12]
    return DeviceKey(KEY_PREFIX + digest, f"{target}{tail}")
