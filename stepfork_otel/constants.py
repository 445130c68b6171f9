"""Every span attribute key, span name and marker stepfork_otel writes or reads.

One module, so the boundaries (which write spans), the span -> event conversion (which reads
them, from a live processor or from a collector's file) and the docs cannot drift apart. No other
module spells an attribute key as a string literal.

Three families of keys are written on each boundary span:

* ``stepfork.*`` -- what replay needs: call kind and sequence number, replay policy, the redacted
  canonical payloads as JSON strings, their SHA-256 fingerprints and sizes, outcome.
* ``gen_ai.*`` -- OpenTelemetry GenAI semantic conventions, so any OTel backend understands the
  span without knowing stepfork.
* ``openinference.span.kind`` / ``input.value`` / ``output.value`` -- OpenInference, so Phoenix and
  Langfuse show the spans natively.
"""

from __future__ import annotations

from typing import Final, Literal

#: Name of the instrumentation scope (the tracer name) used for every stepfork span.
INSTRUMENTATION_NAME: Final = "stepfork_otel"

#: Version of the `.sftrace` bundle format this library writes and the only one it reads (the
#: package is unreleased: versions 1-3 were development formats, refused with a clear error).
#: 4 stores each output once, as the call returned it (its fingerprint is of that text).
FORMAT_VERSION: Final = 4
#: Value of the ``format`` field of every bundle.
FORMAT_NAME: Final = "sftrace"
#: File name suffix of a bundle.
BUNDLE_SUFFIX: Final = ".sftrace"

# --- stepfork.* -------------------------------------------------------------------------------

#: What the span is: ``run`` (the recording root), ``tool`` or ``llm`` (a boundary call).
KIND: Final = "stepfork.kind"
#: Position of the call among the calls started in this trace by this process (run root is 0).
CALL_SEQ: Final = "stepfork.call.seq"
#: Per-call replay policy recorded with the call (see ``stepfork_otel.trace.policy``).
REPLAY_POLICY: Final = "stepfork.replay.policy"
#: The hand-off key of a call's (or run's) redacted canonical input. Never a span attribute since
#: format 4: the text travels once, as ``input.value``.
INPUT: Final = "stepfork.input"
#: SHA-256 (hex) of the UTF-8 bytes of the redacted canonical input.
INPUT_SHA256: Final = "stepfork.input.sha256"
#: Size in bytes of the redacted canonical input.
INPUT_SIZE: Final = "stepfork.input.size"
#: Why the input is not on the span: ``size_cap`` or ``capture_disabled``.
INPUT_OMITTED: Final = "stepfork.input.omitted"
#: First characters of the redacted canonical input, present when the input was left off.
INPUT_PREVIEW: Final = "stepfork.input.preview"
#: The hand-off key of a call's redacted output as returned (a run's: canonical). Never a span
#: attribute since format 4: the text travels once, as ``output.value``.
OUTPUT: Final = "stepfork.output"
#: SHA-256 (hex) of the UTF-8 bytes of the redacted canonical output.
OUTPUT_SHA256: Final = "stepfork.output.sha256"
#: Size in bytes of the redacted canonical output.
OUTPUT_SIZE: Final = "stepfork.output.size"
#: Why the output is not on the span: ``size_cap`` or ``capture_disabled``.
OUTPUT_OMITTED: Final = "stepfork.output.omitted"
#: First characters of the redacted canonical output, present when the output was left off.
OUTPUT_PREVIEW: Final = "stepfork.output.preview"
#: Outcome of the call: ``ok``, ``error`` or ``skipped`` (rejected before its body ran).
STATUS: Final = "stepfork.status"
#: Why the call cannot be replayed, when a payload had no JSON form and was recorded as the
#: ``$unserialisable`` marker: ``input: <what>`` or ``output: <what>`` (a tool's input names the
#: parameters, e.g. ``input: parameter 'ctx' (mod.Context): mod.Client``). A run holding such a
#: call is not complete: it cannot be replayed whole.
UNREPLAYABLE: Final = "stepfork.unreplayable"
#: Qualified type name of the exception the call raised.
ERROR_TYPE: Final = "stepfork.error.type"
#: The exception message after redaction.
ERROR_MESSAGE: Final = "stepfork.error.message"
#: SHA-256 of the canonical ``{provider, model, operation}`` of an LLM call.
MODEL_FINGERPRINT: Final = "stepfork.llm.model_fingerprint"
#: Name of the run (the recording root), e.g. the agent's name.
RUN_NAME: Final = "stepfork.run.name"
#: Set to true on a run that a gateway collector's tail sampling should keep.
RUN_KEEP: Final = "stepfork.run.keep"
#: ``module:function`` the run was recorded from, shown as a hint to copy (never executed).
RUN_ENTRYPOINT: Final = "stepfork.run.entrypoint"
#: Replay mode of the session that produced this span (only on replay runs).
REPLAY_MODE: Final = "stepfork.replay.mode"
#: What replay did with the call: ``substituted``, ``executed`` or ``rejected``.
REPLAY_ACTION: Final = "stepfork.replay.action"
#: On the root span of a replay no span encloses: the trace id of the recorded run it replays.
REPLAY_OF: Final = "stepfork.replay.of"
#: On the run span of a fork: the trace id of the run it was forked from (the span links to it).
FORK_OF: Final = "stepfork.fork.of"
#: On the run span of a fork: the fork point, the position of the first call that ran live.
FORK_AT_CALL: Final = "stepfork.fork.at_call"
#: Version of stepfork_otel that wrote the span.
SDK_VERSION: Final = "stepfork.sdk.version"

# --- calls imported from another instrumentation's spans (trace/foreign*.py) ---------------------
# Set only on the span records the importer builds, never on a span: the conversion reads them
# into the call event's ``fidelity`` / ``unchecked``.

#: How much of the call the imported span held: ``exact``, ``messages-only`` or ``truncated``.
IMPORT_FIDELITY: Final = "stepfork.import.fidelity"
#: What of the request the imported span did not hold, so replay cannot check it (a list).
IMPORT_UNCHECKED: Final = "stepfork.import.unchecked"
#: The request and response as sent and received (the bundle holds them as a recording would).
FIDELITY_EXACT: Final = "exact"
#: A projection of the request (messages, maybe tools and parameters) and a response rebuilt
#: from the output messages: matched on what the span held.
FIDELITY_MESSAGES_ONLY: Final = "messages-only"
#: Like ``messages-only``, with the earliest messages lost (an attribute limit evicted them).
FIDELITY_TRUNCATED: Final = "truncated"
FIDELITIES: Final = (FIDELITY_EXACT, FIDELITY_MESSAGES_ONLY, FIDELITY_TRUNCATED)
#: The fidelities whose recorded input is a request form (``trace/foreign_request.py``).
SEMANTIC_FIDELITIES: Final = frozenset({FIDELITY_MESSAGES_ONLY, FIDELITY_TRUNCATED})
#: On the run of an imported trace: the tools the model called that no span shows running.
IMPORT_UNTRACED_TOOLS: Final = "stepfork.import.untraced_tools"
#: logfire's span type attribute (``span``/``log``): how ``stepfork import`` knows logfire wrote it.
LOGFIRE_SPAN_TYPE: Final = "logfire.span_type"

# --- OpenTelemetry GenAI semantic conventions ---------------------------------------------------

GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
#: Input tokens written to the provider's prompt cache (semantic-conventions-genai#440 renamed
#: ``cache_creation`` to ``cache_write``): both names are emitted, the old one for the back-ends
#: that still read it, until they have moved.
GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS: Final = "gen_ai.usage.cache_write.input_tokens"
#: The name of :data:`GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS` before the rename (same value).
GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS: Final = "gen_ai.usage.cache_creation.input_tokens"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P: Final = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K: Final = "gen_ai.request.top_k"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_FREQUENCY_PENALTY: Final = "gen_ai.request.frequency_penalty"
GEN_AI_REQUEST_PRESENCE_PENALTY: Final = "gen_ai.request.presence_penalty"
GEN_AI_REQUEST_STOP_SEQUENCES: Final = "gen_ai.request.stop_sequences"
GEN_AI_REQUEST_SEED: Final = "gen_ai.request.seed"
GEN_AI_REQUEST_CHOICE_COUNT: Final = "gen_ai.request.choice.count"
GEN_AI_REQUEST_STREAM: Final = "gen_ai.request.stream"
GEN_AI_OUTPUT_TYPE: Final = "gen_ai.output.type"
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
GEN_AI_SYSTEM_INSTRUCTIONS: Final = "gen_ai.system_instructions"
GEN_AI_TOOL_DEFINITIONS: Final = "gen_ai.tool.definitions"
#: The log record (event) in which opentelemetry-util-genai puts a call's content when it is not
#: on the span (``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=EVENT_ONLY``, the default of
#: openai-v2's newer releases): ``stepfork import`` joins it to its span by its trace and span id.
GEN_AI_DETAILS_EVENT: Final = "gen_ai.client.inference.operation.details"
#: The older SDK events API wrote an event's name as this log record attribute.
EVENT_NAME_ATTRIBUTE: Final = "event.name"
GEN_AI_TOOL_DESCRIPTION: Final = "gen_ai.tool.description"
GEN_AI_TOOL_TYPE: Final = "gen_ai.tool.type"
#: The provider in older releases of the conventions (read from other instrumentations' spans).
GEN_AI_SYSTEM: Final = "gen_ai.system"
#: An ``execute_tool`` span's arguments and result (JSON text), when content is captured
#: (read from framework instrumentations' tool spans by ``stepfork import``).
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
#: OpenLLMetry's (traceloop) own keys, read by ``stepfork import``: the operation (``chat``),
#: the prefix of its flattened tool definitions and its older token counts.
TL_REQUEST_TYPE: Final = "llm.request.type"
TL_REQUEST_FUNCTIONS: Final = "llm.request.functions"
TL_USAGE_PROMPT_TOKENS: Final = "gen_ai.usage.prompt_tokens"
TL_USAGE_COMPLETION_TOKENS: Final = "gen_ai.usage.completion_tokens"
#: OpenLLMetry's flag of a streamed call (only it writes this key).
TL_IS_STREAMING: Final = "gen_ai.is_streaming"
#: OpenLLMetry's flattened messages: ``gen_ai.prompt.N.*`` (the request's), ``gen_ai.completion.N.*``
#: (the response's choices).
TL_PROMPT: Final = "gen_ai.prompt"
TL_COMPLETION: Final = "gen_ai.completion"
#: Semconv ``error.type``: the class of the error a failed call ended with.
ERROR_TYPE_SEMCONV: Final = "error.type"
#: Environment variable (shared with the OTel GenAI instrumentations) that turns on message
#: content in the ``gen_ai.*.messages`` attributes.
ENV_CAPTURE_MESSAGE_CONTENT: Final = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
#: Environment variable of the pytest plugin's record mode (``none``, ``once``, ``all``).
ENV_RECORD_MODE: Final = "STEPFORK_RECORD_MODE"

#: ``gen_ai.operation.name`` values.
OP_EXECUTE_TOOL: Final = "execute_tool"
OP_CHAT: Final = "chat"
OP_INVOKE_AGENT: Final = "invoke_agent"
OP_EMBEDDINGS: Final = "embeddings"
OP_TEXT_COMPLETION: Final = "text_completion"
#: ``gen_ai.tool.type`` of a ``@trace_tool`` function.
TOOL_TYPE_FUNCTION: Final = "function"
#: ``gen_ai.provider.name`` values of the SDK integrations.
PROVIDER_OPENAI: Final = "openai"
PROVIDER_ANTHROPIC: Final = "anthropic"

# --- streamed calls: the keys of a recorded stream value (recording/streams.py) -----------------

STREAM_CHUNKS: Final = "chunks"
STREAM_COMPLETE: Final = "complete"
STREAM_ERROR: Final = "error"
#: Span attribute: the call returned a stream (its output is a recorded stream value).
STREAM: Final = "stepfork.stream"
#: Span attribute: the number of chunks the agent read from a streamed call.
STREAM_CHUNK_COUNT: Final = "stepfork.stream.chunks"

# --- OpenInference -----------------------------------------------------------------------------

OPENINFERENCE_SPAN_KIND: Final = "openinference.span.kind"
INPUT_VALUE: Final = "input.value"
INPUT_MIME_TYPE: Final = "input.mime_type"
OUTPUT_VALUE: Final = "output.value"
OUTPUT_MIME_TYPE: Final = "output.mime_type"
MIME_JSON: Final = "application/json"
#: A TOOL span's description (the docstring) and JSON schema of its parameters.
OI_TOOL_DESCRIPTION: Final = "tool.description"
OI_TOOL_PARAMETERS: Final = "tool.parameters"
#: A TOOL span's tool name (framework instrumentations; read by ``stepfork import``).
OI_TOOL_NAME: Final = "tool.name"
#: What OpenInference's LLM spans say of the call (read by ``stepfork import``,
#: ``trace/foreign.py``): the provider (``llm.system`` in older releases), the request's
#: parameters but the messages (JSON), the response's model and the token counts.
OI_LLM_PROVIDER: Final = "llm.provider"
OI_LLM_SYSTEM: Final = "llm.system"
OI_INVOCATION_PARAMETERS: Final = "llm.invocation_parameters"
OI_MODEL_NAME: Final = "llm.model_name"
OI_TOKEN_COUNT_PROMPT: Final = "llm.token_count.prompt"
OI_TOKEN_COUNT_COMPLETION: Final = "llm.token_count.completion"
#: The finish reason of an OpenInference LLM span's first choice.
OI_FINISH_REASON: Final = "llm.finish_reason"
#: OpenInference's per-message attributes: ``llm.input_messages.N.message.*`` and the output's.
OI_INPUT_MESSAGES: Final = "llm.input_messages"
OI_OUTPUT_MESSAGES: Final = "llm.output_messages"

#: The keys of one payload, in this order: the hand-off key, sha256, size, omitted, preview, and
#: the OpenInference value (the text on the span) and mime type. Written by the boundaries, read by the span -> event
#: conversion.
INPUT_KEYS: Final = (
    INPUT,
    INPUT_SHA256,
    INPUT_SIZE,
    INPUT_OMITTED,
    INPUT_PREVIEW,
    INPUT_VALUE,
    INPUT_MIME_TYPE,
)
OUTPUT_KEYS: Final = (
    OUTPUT,
    OUTPUT_SHA256,
    OUTPUT_SIZE,
    OUTPUT_OMITTED,
    OUTPUT_PREVIEW,
    OUTPUT_VALUE,
    OUTPUT_MIME_TYPE,
)

# --- OTel exception event (the sanitised one stepfork writes instead of record_exception) -------

EXCEPTION_EVENT: Final = "exception"
EXCEPTION_TYPE: Final = "exception.type"
EXCEPTION_MESSAGE: Final = "exception.message"

# --- values ------------------------------------------------------------------------------------

KIND_RUN: Final = "run"
KIND_TOOL: Final = "tool"
KIND_LLM: Final = "llm"
#: The ``stepfork.kind`` values of boundary calls (as opposed to the run).
BOUNDARY_KINDS: Final = (KIND_TOOL, KIND_LLM)

#: ``openinference.span.kind`` values.
OI_KIND_TOOL: Final = "TOOL"
OI_KIND_LLM: Final = "LLM"
OI_KIND_AGENT: Final = "AGENT"

#: ``stepfork.replay.action`` values: what replay did with a call -- the one spelling of them.
ReplayAction = Literal["substituted", "executed", "rejected"]
#: The actions a replay session decides for a call it lets through (a refusal is ``rejected``).
DecidedAction = Literal["substituted", "executed"]
ACTION_SUBSTITUTED: Final[DecidedAction] = "substituted"
ACTION_EXECUTED: Final[DecidedAction] = "executed"
ACTION_REJECTED: Final[ReplayAction] = "rejected"
REPLAY_ACTIONS: Final[tuple[ReplayAction, ...]] = (
    ACTION_SUBSTITUTED,
    ACTION_EXECUTED,
    ACTION_REJECTED,
)

#: First bytes of a gzip stream (a compressed bundle or collector file).
GZIP_MAGIC: Final = b"\x1f\x8b"

OMITTED_SIZE_CAP: Final = "size_cap"
OMITTED_CAPTURE_DISABLED: Final = "capture_disabled"

STATUS_OK: Final = "ok"
STATUS_ERROR: Final = "error"
STATUS_SKIPPED: Final = "skipped"

# --- how much of a payload or fingerprint people are shown (one place for every length) ---------

#: Characters of a payload kept as ``stepfork.*.preview`` on a span when the payload is left off.
PREVIEW_CHARS: Final = 256
#: Characters of a redacted input preview in a replay error message.
ERROR_PREVIEW_CHARS: Final = 160
#: Characters of a payload preview in CLI reports (``--verbose``: :data:`VERBOSE_PREVIEW_CHARS`).
REPORT_PREVIEW_CHARS: Final = 100
VERBOSE_PREVIEW_CHARS: Final = 2000
#: Hex digits of a SHA-256 fingerprint shown where it is abbreviated (followed by an ellipsis).
FINGERPRINT_CHARS: Final = 12
#: Default cap (bytes of canonical JSON) above which a payload is left off the span.
DEFAULT_MAX_SPAN_PAYLOAD_BYTES: Final = 64 * 1024

# --- environment ----------------------------------------------------------------------------------

#: Environment variable naming the bundle directory for the zero-code path: under
#: ``opentelemetry-instrument``, stepfork attaches to the provider the SDK configured from the
#: ``OTEL_*`` variables and writes a bundle per run there (``stepfork_otel.otel.zero_code``).
ENV_BUNDLE_DIRECTORY: Final = "STEPFORK_DIRECTORY"

# --- environment reads: the fingerprint of a value (see docs/replay.md) --------------------------

#: The key derivation that fingerprints an environment value: PBKDF2-HMAC-SHA-256 with a random
#: salt of its own per read, stored beside it (``{"kdf", "iterations", "salt"}`` in the read's
#: ``value``), so that replay can compare a live value and nothing precomputed applies.
ENV_KDF: Final = "pbkdf2-sha256"
#: Iterations of :data:`ENV_KDF` for a new recording (about 4 ms per variable read in a run).
ENV_KDF_ITERATIONS: Final = 10_000
#: The most iterations a bundle may ask replay to make for one read (a hostile bundle's cost).
ENV_KDF_MAX_ITERATIONS: Final = 100_000
#: Random bytes of each salt.
ENV_SALT_BYTES: Final = 16

# --- limits on what is read (hostile input; see docs/guarantees.md) -----------------------------

#: Bytes a compressed bundle or collector file may expand to, in all.
DEFAULT_MAX_DECOMPRESSED_BYTES: Final = 2 * 1024**3
#: Times its compressed size a gzip file may expand to, once past the ratio-free start below
#: (bundles and collector files compress 5-10 times; a run of one byte, a "bomb", ~1000 times).
DEFAULT_MAX_COMPRESSION_RATIO: Final = 200
#: Bytes a gzip file may expand to whatever its ratio (a small, very repetitive file is read).
DEFAULT_RATIO_FREE_BYTES: Final = 1024**2
#: Bytes of one line of a bundle or a collector file (a payload line included).
DEFAULT_MAX_LINE_BYTES: Final = 256 * 1024**2
#: Levels of JSON nesting in a bundle's header, a payload or an OTLP record (orjson writes 254).
DEFAULT_MAX_JSON_DEPTH: Final = 254

# --- crash-durable recording (see docs/guarantees.md) -------------------------------------------

#: Seconds between two fsyncs of a bundle being written as its run goes.
DEFAULT_FSYNC_INTERVAL: Final = 1.0

# --- memory bounded by what is open: the bundle written as the run goes (issue 13, item 2) --------

#: Seconds at most between a call's end and its events reaching the OS (the background flush of
#: a run's bundle; 0: written as each call ends; None: only when the buffer fills and at the end).
DEFAULT_FLUSH_INTERVAL: Final = 1.0
#: Bytes of a run's bundle buffered before they are written whatever the interval.
FLUSH_BUFFER_BYTES: Final = 1 << 20
# --- determinism capture: clock, randomness, uuids, environment (recording/determinism.py) ------

#: On a boundary span: JSON list of the nondeterministic reads the run made since the previous
#: call (each with its source, call site and value); on the run span: the reads after the last call.
CAPTURED: Final = "stepfork.captured"
#: On the run span: JSON list of ``{source, module, function, line, count}`` (``capture="audit"``).
CAPTURED_AUDIT: Final = "stepfork.captured.audit"
#: On the run span: the capture sources asked for, comma-separated (``time,random`` or ``audit``).
CAPTURE: Final = "stepfork.capture"
#: The capture source groups ``record(capture=...)`` accepts (``"all"`` is every one of them).
CAPTURE_TIME: Final = "time"
CAPTURE_RANDOM: Final = "random"
CAPTURE_UUID: Final = "uuid"
CAPTURE_SECRETS: Final = "secrets"
CAPTURE_ENV: Final = "env"
CAPTURE_SOURCES: Final = (CAPTURE_TIME, CAPTURE_RANDOM, CAPTURE_UUID, CAPTURE_SECRETS, CAPTURE_ENV)
#: ``capture="all"``: every group above; ``capture="audit"``: list the reads, record no values.
CAPTURE_ALL: Final = "all"
CAPTURE_AUDIT: Final = "audit"
#: What a captured read is in a bundle: a served ``value``, a checked ``env`` variable, an
#: ``audit`` tally (no value).
CapturedKind = Literal["value", "env", "audit"]

# --- token usage another GenAI span already reports (recording/integrations/genai.py) ----------

#: The call's token usage when the span's parent is another instrumentation's GenAI span (which
#: reports ``gen_ai.usage.*`` itself: the convention's keys on both would count it twice), so
#: that the bundle's ``usage`` is still filled.
USAGE_INPUT_TOKENS: Final = "stepfork.usage.input_tokens"
USAGE_OUTPUT_TOKENS: Final = "stepfork.usage.output_tokens"
