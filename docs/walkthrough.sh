#!/usr/bin/env bash
# README.md's "Five minutes with Ferry", runnable. Against a fresh node (`scripts/run`, or
# `ferry server --memory`), with `ferry` on the PATH:
#
#   FERRY_SERVER=127.0.0.1:7400 docs/walkthrough.sh
#
# integration-tests/tests/walkthrough.rs starts a node, runs each command against it and checks
# what it prints against the lines after it: "#> " a line on stdout, "#! " a line on stderr.
# Within a line "..." matches any text and runs of spaces match any run of spaces; a line of
# "..." alone matches any lines. A command must succeed. One ending in "&" runs in the
# background; its output is checked at the end of its block.
#
# Each "# block" line starts a code block of README.md, which must show its commands exactly as
# they are here, without the "#>" and "#!" lines ("# block transcript": as a terminal session,
# each command after "$ " and its stdout below it). Other comment lines are this file's own.
set -euo pipefail

# block
ferry queue create orders
#> created queue orders on node-1
ferry send --queue orders 'first order' --property amount=250 --property vip=true --priority 7
#> ID:...
ferry send --queue orders --count 3                  # three generated messages
#> ID:...
#> ID:...
#> ID:...
echo 'from stdin' | ferry send --queue orders
#> ID:...
ferry queue stats                                    # ready / scheduled / leased / consumers ...
#> ...
#> | orders | 5 | 0 | 0 | 0 | ...
#> ...
ferry browse --queue orders                          # look without taking
#> ID:... priority 7
#>   amount = 250 (int)
#>   vip = true (bool)
#>   first order [ready]
#> ID:... priority 4
#>   message 1 [ready]
#> ID:... priority 4
#>   message 2 [ready]
#> ID:... priority 4
#>   message 3 [ready]
#> ID:... priority 4
#>   from stdin
#>   [ready]
ferry receive --queue orders --count 2 --timeout-ms 1000   # the first two: priority 7 first
#> ID:... delivery 1 priority 7
#>   amount = 250 (int)
#>   vip = true (bool)
#>   first order
#> ID:... delivery 1 priority 4
#>   message 1

# block
ferry send --queue orders big --property amount=900
#> ID:...
ferry receive --queue orders --selector "amount > 500 AND JMSPriority >= 4" --timeout-ms 0
#> ID:... delivery 1 priority 4
#>   amount = 900 (int)
#>   big
ferry browse --queue orders                          # the rest is still there, in order
#> ID:... priority 4
#>   message 2 [ready]
#> ID:... priority 4
#>   message 3 [ready]
#> ID:... priority 4
#>   from stdin
#>   [ready]

# block
ferry queue create tasks
#> created queue tasks on node-1
ferry send --queue tasks 'try me'
#> ID:...
ferry receive --queue tasks --ack none               # delivery 1
#> ID:... delivery 1 priority 4
#>   try me
ferry receive --queue tasks                          # delivery 2 (redelivered)
#> ID:... delivery 2 (redelivered) priority 4
#>   try me
ferry browse --queue tasks                           # nothing left
#! no messages in queue tasks

# block
ferry queue create jobs --max-redeliveries 3 --redelivery-initial-delay-ms 1000 \
    --redelivery-delay-ms 1000 --exponential-backoff --backoff-multiplier 2 \
    --collision-avoidance-percent 10 --max-redelivery-delay-ms 60000
#> created queue jobs on node-1
ferry queue show jobs                                # every setting, defaults included
#> queue jobs on node-1
#>   lease 30 s by default, 12 h at most
#>   max message size 1 MiB
#>   max messages unlimited
#>   max bytes unlimited
#>   max redeliveries 3
#>   redelivery delay first 1 s, then 1 s, x2 each time, +/- 10 %, at most 1 min
#>   dead letters to jobs.DLQ
#>   expired to jobs.DLQ
#>   dedup window 10 min
#>   replicas 1 (not replicated)
ferry send --queue jobs 'bad input'
#> ID:...
ferry receive --queue jobs --ack reject              # straight to jobs.DLQ, reason "rejected"
#> ID:... delivery 1 priority 4
#>   bad input
ferry receive --queue jobs.DLQ
#> ID:... delivery 1 priority 4
#>   FerryDeadLetterReason = "rejected" (string)
#>   FerryDeliveryCount = 1 (long)
#>   FerryOriginalMessageId = "ID:..." (string)
#>   FerryOriginalQueue = "jobs" (string)
#>   bad input
ferry send --queue jobs soon-stale --ttl-ms 100      # expires unconsumed: to jobs.DLQ, "expired"
#> ID:...

# block
ferry queue create pricing
#> created queue pricing on node-1
ferry reply --queue pricing --count 1 &              # answers one request (echoes its body)
#> answered ID:... with ID:...
ferry request --queue pricing 'quote ACME' --timeout-ms 5000
#> ID:... delivery 1 priority 4
#>   correlation id: "ID:..."
#>   quote ACME

# block transcript
ferry queue create invoices -o json
#> {"created":true,"owner_node":"node-1","queue":"invoices"}
ferry send --queue invoices hello --correlation-id req-1 -o json
#> {"message_id":"ID:...","queue":"invoices"}
ferry receive --queue invoices -o json
#> {"body":"hello","correlation_id":"req-1","delivery_count":1,...}
ferry queue stats invoices -o json
#> {"acked_total":1,"bytes":0,"consumers":0,...,"queue":"invoices","ready":0,...}
