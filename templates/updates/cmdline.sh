# shellcheck shell=sh
# The kernel's command line for sparkrig's updates (the KernelCmdline fact): what the kernel
# booted with, what sparkrig's GRUB drop-in ($1) asks, whether there is a boot loader to apply
# it (update-grub), and what the generated configuration's first kernel line passes.
printf 'running %s\n' "$(cat /proc/cmdline)"
if [ -f "$1" ]; then sed -n 's/^# sparkrig-cmdline \(add\|remove\) /\1 /p' "$1"; fi
if command -v update-grub >/dev/null 2>&1; then echo "loader update-grub"; else echo "loader none"; fi
if [ -f /boot/grub/grub.cfg ]; then
  printf 'generated %s\n' "$(sed -n 's/^[[:space:]]*linux[[:space:]][[:space:]]*[^[:space:]]*[[:space:]]*//p' /boot/grub/grub.cfg | head -n 1)"
fi
