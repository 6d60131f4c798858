# shellcheck shell=sh
# Prints the loaded NVIDIA driver: the kernel module's own line ("nvproc ..."), else a
# root-owned nvidia-smi's answer ("nvsmi ..."); no line: no driver loaded.
# Run by sparkrig's updates (the Versions fact); no arguments.
if [ -r /proc/driver/nvidia/version ]; then sed -n '1s/^/nvproc /p' /proc/driver/nvidia/version
elif smi=$(command -v nvidia-smi) && [ -n "$(find "$smi" -maxdepth 0 -user root ! -perm /022)" ]; then
  "$smi" --query-gpu=driver_version --format=csv,noheader 2>/dev/null | sed 's/^/nvsmi /'
fi
true
