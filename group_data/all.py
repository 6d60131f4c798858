"""
Every sparkrig setting, with its default. Applies to all hosts.

Override a setting for some hosts in group_data/<group>.py or in the inventory's
host data. Settings are validated before any host is contacted: a bad value stops
the run with a message that names the host, the key and what is allowed.
Each concern's module under operations/ declares the same keys and defaults in
its SETTINGS (tests/unit/test_settings.py keeps the two in step).
"""

# --- Hardware profile (operations/hardware.py) -------------------------------

# Which entry of hardware_profiles describes the hosts. The lab inventory sets
# "rtx50" (x86_64 hosts); a Hopper box uses "hopper".
hardware_profile = "gb10"

# The kinds of box sparkrig knows: CPU architecture, the GPU's compute capability,
# and the TORCH_CUDA_ARCH_LIST that source builds target. Add your own kind here.
hardware_profiles = {
    "gb10": {"arch": "aarch64", "compute_capability": "12.1", "torch_cuda_arch_list": "12.1a"},
    "rtx50": {"arch": "x86_64", "compute_capability": "12.0", "torch_cuda_arch_list": "12.0"},
    "hopper": {"arch": "x86_64", "compute_capability": "9.0", "torch_cuda_arch_list": "9.0"},
}

# --- CUDA environment (operations/cuda_env.py) -------------------------------

# The single KEY=VALUE file holding CUDA_HOME, PATH, LD_LIBRARY_PATH,
# TORCH_CUDA_ARCH_LIST, TRITON_PTXAS_PATH, TRITON_PTXAS_BLACKWELL_PATH and
# UV_NO_SYNC=1. Login shells read it through /etc/profile.d/sparkrig-cuda.sh;
# systemd units read it with EnvironmentFile=.
cuda_env_file = "/etc/sparkrig/cuda.env"

# CUDA_HOME when the host has no /usr/local/cuda link and no /usr/local/cuda-X.Y
# directory (the link's target, else the newest X.Y, wins when present).
cuda_env_default_home = "/usr/local/cuda"

# Extra variables for the same file, e.g. {"HF_HOME": "/data/hf"}. Names must be
# valid variable names other than the managed ones above; values are literal
# strings without single quotes or newlines.
cuda_env_extra = {}

# --- Swap (operations/swap.py) -----------------------------------------------

# Turn swap off now and keep it off: every swap entry of /etc/fstab commented out
# (the old file kept as /etc/fstab.sparkrig.bak), swap and zram units masked and
# stopped, swapoff -a while swap is active. On GB10 swap turns memory pressure into
# a freeze of the whole box instead of an OOM kill. False leaves swap as it is.
swap_disable = True

# Also delete, once swap is off, the swap files (regular files with a swap signature,
# e.g. /swap.img) of the fstab entries sparkrig disabled. Off by default: deleting is
# the one step that uncommenting a line cannot undo.
swap_remove_files = False

# --- SSH guard (operations/sshd_guard.py) ------------------------------------

# Memory reserved for the unit that runs sshd (MemoryMin=, base-1024 K/M/G/T).
# It covers the listener and pre-auth processes; sessions live in user slices.
# The unit's OOMScoreAdjust is always set to 0: sshd protects its own listener,
# and -1000 on the unit would make every SSH session unkillable.
sshd_guard_memory_min = "128M"

# Memory reserved for system.slice (MemoryMin=): a unit's reservation is capped
# by its parent slice's, so this must be at least sshd_guard_memory_min.
sshd_guard_system_slice_memory_min = "512M"
