"""The sandbox's schema (conf/sandbox/): the limits of one jailed call, read by `opd.tools`."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING

from opd.config.checks import at_least, checked, one_of, within

# It ran jailed code without a mount namespace: the launcher's file tools could be led through the
# code's hard links, and it shared /tmp and /var/tmp with the machine.
_UNSHARE_REMOVED = ("it gave jailed code no mount isolation (shared /tmp, the launcher's file tools led through its hard links). "
                    "Use bwrap (the default; scripts/install.sh installs the Debian package bubblewrap, or `apt-get install bubblewrap`)")


@dataclass
class SandboxConfig:
    """The jail of one sandboxed call (conf/sandbox/default.yaml); `opd.tools` reads it as is."""

    backend: str = checked(one_of("bwrap", removed={"unshare": _UNSHARE_REMOVED}))
    timeout_s: float = checked(at_least(1))
    cpu_s: int = checked(at_least(1))
    memory_mb: int = checked(at_least(1))
    file_size_mb: int = checked(at_least(1))
    max_processes: int = checked(at_least(1))
    max_open_files: int = checked(at_least(8))
    tmp_mb: int = checked(at_least(1))
    # At least 16: room for the files the harness and the prompt put there.
    tmp_files: int = checked(at_least(16))
    workspace_mb: int = checked(at_least(1))
    workspace_files: int = checked(at_least(16))
    output_chars: int = checked(at_least(1))
    isolate_network: bool = MISSING
    # Its 60,000 uids below 2**31: bwrap cannot map a uid above ("setting up uid map: Invalid argument").
    uid_base: int = checked(within(1000, 2**31 - 60_001))
