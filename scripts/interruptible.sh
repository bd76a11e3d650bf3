#!/usr/bin/env bash
# Run a long qualify command from make so that Ctrl-C ends it with the command's own one line.
#
# The terminal sends SIGINT to make as well, and GNU make prints its own
# "make: *** [Makefile:N: sweep] Interrupt" (or "Error 130") for a recipe that a signal ended or
# that ended non-zero. Here this shell ignores SIGINT (so it outlives the command), the command
# takes SIGINT back (SQ_INTERRUPTIBLE=1: pipeline/cli.py installs Python's handler), prints its
# line and exits 130; this shell then ends the recipe 0, and make, which got the SIGINT itself,
# dies of it without a word: the user's shell sees 130. Any other exit code goes to make as is.
trap '' INT
SQ_INTERRUPTIBLE=1 "$@"
rc=$?
[ "$rc" -eq 130 ] && exit 0
exit "$rc"
