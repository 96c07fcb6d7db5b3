"""The fire stage: what every typed executor does with its batch, in order.

The state machine invokes the type's executor once per batch, with ids, versions and due
milliseconds only (`batch`). The executor (`executor.execute`):

1. claims each task (`claims`: the exactly-once lock, held by this invocation until its
   end: `TaskStore.claim`) and reads the task from the claim's reply;
2. plans the tasks of a flow with a rate (`plans`): their slots, and those it cannot send
   in its time handed on to executions that wake for them;
3. sends (`sends`): a task alone, or the SQS, SNS and EventBridge tasks due in one
   millisecond at one queue, topic or bus, ten to a call, each call in a thread of its
   own that prepares it, sleeps to its millisecond, sends, and retries transient failures
   (a call's, or its entries') with backoff in the time the invocation has left;
4. marks each task (`marks`): SUCCEEDED (the sent marker, conditional on this
   invocation), or FAILED with a dead-letter message of its own, in one write with the
   callback task it owes so ended, if any (`tocsin.callbacks`), which the invocation
   starts once its sends are done.

A slow target holds up only its own call, and a target's unforeseen error (neither
transient nor permanent) fails only its own call's tasks.

Only what concerns the whole batch fails the invocation, for the state machine to retry:
a claim or mark that could not be written in the time the invocation has
(`writes.TableUnavailable`), a task a live invocation of this execution still holds
(`executor.DeliveryInProgress`), or a task never tried for want of time
(`sends.NoTimeToSend`). Failing, the invocation lets go of the tasks it has not finished,
so the retry takes them over at once; a task it sent but could not mark is written to the
sent log (`tocsin.sent`), which an invocation reads before it sends a task it takes over.
"""
