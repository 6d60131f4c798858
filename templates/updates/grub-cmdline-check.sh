# shellcheck shell=sh
# Validates a new GRUB drop-in for the kernel's command line ($1) before it takes effect: the
# shell grub-mkconfig sources must read it (sh -n), and sourced as grub-mkconfig sources it,
# over a command line holding each parameter it names in another value, it must leave each
# added parameter once and no removed one. The parameters are its "# sparkrig-cmdline" lines.
sh -n "$1" || exit
adds=$(sed -n 's/^# sparkrig-cmdline add //p' "$1")
removes=$(sed -n 's/^# sparkrig-cmdline remove //p' "$1")
sample=
for word in $adds $removes; do sample="$sample ${word%%=*}=sparkrig-check"; done
result=$(GRUB_CMDLINE_LINUX="quiet$sample" GRUB_CMDLINE_LINUX_DEFAULT="splash$sample" sh -c '. "$1" && printf "%s\n%s\n" "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT"' sh "$1") || exit
linux=$(printf '%s\n' "$result" | sed -n 1p)
for word in $adds; do
  count=0
  for have in $linux; do [ "$have" = "$word" ] && count=$((count + 1)); done
  if [ "$count" -ne 1 ]; then echo "the drop-in leaves $word $count times in GRUB_CMDLINE_LINUX" >&2; exit 1; fi
done
for have in $result; do
  case $have in *=sparkrig-check) echo "the drop-in leaves $have" >&2; exit 1 ;; esac
  for word in $removes; do
    case $have in "$word" | "$word"=*) echo "the drop-in leaves removed $have" >&2; exit 1 ;; esac
  done
done
