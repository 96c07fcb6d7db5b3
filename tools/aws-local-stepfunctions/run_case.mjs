// Executions of a state machine on aws-local-stepfunctions, every Task state answered
// by the responses given (tests/integration/test_task_machine_paths.py drives it).
//
// stdin, one a line: {"definition": {...}, "input": {...}, "execution_id": "arn:...",
//         "responses": {"<Task state>": [{"return": value} | {"throw": {"name", "message"}}]},
//         "real_waits": false}
//   The n-th call of a Task state gets the n-th response (the last one again past the end);
//   a Task state without responses fails the execution, neither retried nor caught. Wait
//   states last 0 ms unless real_waits, and every retry's pause is 0 ms.
// stdout, one a line: {"status": "SUCCEEDED" | "FAILED", "output" | "error" and "cause",
//          "entered", "calls": {"<Task state>": [{"input", "at_ms"}]}, "retries": [{"state", "retrier",
//          "error"}], "caught": [{"state", "catcher", "error"}]}

import { createInterface } from "node:readline";

// aws-local-stepfunctions 3 calls Promise.withResolvers (Node 22) in every Task state; on
// Node 20 each Task failed with a TypeError, which the Fire state's Catch then caught.
if (typeof Promise.withResolvers !== "function") {
  Promise.withResolvers = function withResolvers() {
    let resolve, reject;
    const promise = new this((res, rej) => {
      resolve = res;
      reject = rej;
    });
    return { promise, resolve, reject };
  };
}

const { StateMachine } = await import("aws-local-stepfunctions");

async function run(doc) {
  const states = doc.definition.States;

  const calls = {};
  const taskResourceLocalHandlers = {};
  const waitTimeOverrides = {};
  const retryIntervalOverrides = {};
  for (const [name, state] of Object.entries(states)) {
    if (state.Type === "Task") {
      calls[name] = [];
      taskResourceLocalHandlers[name] = async (input) => {
        calls[name].push({ input: structuredClone(input), at_ms: Date.now() });
        const listed = doc.responses[name] ?? [];
        if (listed.length === 0) {
          const error = new Error(`no response given for the Task state ${name}`);
          error.name = "NoResponseGiven";
          error.isRetryable = false;
          error.isCatchable = false;
          throw error;
        }
        const response = listed[Math.min(calls[name].length, listed.length) - 1];
        if (response.throw) {
          // Retry and Catch match ErrorEquals against the name; a Catch's Cause is the message
          const error = new Error(response.throw.message ?? "");
          error.name = response.throw.name;
          throw error;
        }
        return response.return ?? null;
      };
    }
    if (state.Type === "Wait" && !doc.real_waits) waitTimeOverrides[name] = 0;
    if (state.Retry) retryIntervalOverrides[name] = 0;
  }

  // The interpreter's context object has no execution id: the ASL reads $$.Execution.Id.
  const context = { Execution: { Id: doc.execution_id, Name: doc.execution_id.split(":").pop() } };
  const report = { entered: [], calls, retries: [], caught: [] };
  let lastError = null;
  const machine = new StateMachine(doc.definition, {
    validationOptions: { noValidate: !doc.validate },
  });
  const execution = machine.run(doc.input, {
    overrides: { taskResourceLocalHandlers, waitTimeOverrides, retryIntervalOverrides },
    context,
  });
  const outcome = execution.result.then(
    (output) => ({ output }),
    (error) => ({ error }),
  );
  for await (const event of execution.eventLogs) {
    const name = event.state?.name;
    if (event.type === "StateEntered") report.entered.push(name);
    if (event.type === "StateFailed") lastError = event.Error;
    if (event.type === "StateRetried") {
      const retrier = states[name].Retry.indexOf(event.retry.retrier);
      report.retries.push({ state: name, retrier, error: lastError });
    }
    if (event.type === "StateCaught") {
      const catcher = states[name].Catch.indexOf(event.catch.catcher);
      report.caught.push({ state: name, catcher, error: lastError });
    }
    if (event.type === "ExecutionFailed") {
      report.error = event.Error;
      report.cause = String(event.Cause);
    }
  }
  const { output, error } = await outcome;
  if (error) {
    report.status = "FAILED";
    report.error ??= error.cause?.name ?? error.name;
    report.cause ??= error.cause?.message ?? error.message;
  } else {
    report.status = "SUCCEEDED";
    report.output = output;
  }
  return report;
}

// One execution per line of input, its report on one line of output, until stdin closes:
// the interpreter's import (about half a second) is paid once per test process.
const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of lines) {
  if (line.trim()) process.stdout.write(JSON.stringify(await run(JSON.parse(line))) + "\n");
}
