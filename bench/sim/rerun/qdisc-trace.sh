#!/bin/bash
# qdisc-trace.sh NS OUTFILE: every ~2 ms, the tx bytes of every port h0..h7 of namespace NS (the
# cluster's switch: what each host receives), until killed. Line: t_ns tx_h0 tx_h1 ...
exec ip netns exec "$1" bash -c '
cd /sys/class/net
while :; do
  t=$(date +%s%N); l="$t"
  for d in h0 h1 h2 h3 h4 h5 h6 h7; do read -r b < $d/statistics/tx_bytes; l="$l $b"; done
  echo "$l"; sleep 0.002
done' >>"$2"
