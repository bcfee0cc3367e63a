#!/usr/bin/env node
// An independent gRPC client stack against the server: @grpc/grpc-js on Node's own
// HTTP/2 (nghttp2 inside Node), with the KServe/Triton service loaded from a
// FileDescriptorSet that the Python test writes from tritonclient's compiled protos.
//
//   node grpc_js_client.js SCENARIO HOST:PORT DESCRIPTOR_SET
//
// Prints one JSON object (what the scenario observed) on stdout and exits 0; a check
// that fails prints {"error": ...} and exits 1. tests/test_interop_grpc_js.py runs each
// scenario and asserts on the values it reports.
'use strict';

// Counted before grpc-js loads: proof that messages really left compressed.
const zlib = require('zlib');
const compressed = { gzip: 0, deflate: 0 };
for (const name of Object.keys(compressed)) {
  const original = zlib[name];
  zlib[name] = function (...args) {
    compressed[name] += 1;
    return original.apply(this, args);
  };
}

// And what its decompressors take in: proof that answers really arrived compressed
// (zlib's create* functions are read-only; the classes' prototypes are not).
const inflaters = { Gunzip: 0, Inflate: 0 };
for (const name of Object.keys(inflaters)) {
  const prototype = zlib[name].prototype;
  const original = prototype._transform;
  prototype._transform = function (...args) {
    inflaters[name] += 1;
    return original.apply(this, args);
  };
}

const crypto = require('crypto');
const fs = require('fs');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [scenarioName, address, descriptorPath] = process.argv.slice(2);
const LOADER_OPTIONS = { keepCase: true, longs: String, enums: String, oneofs: true,
                         defaults: true };
const MiB = 1024 * 1024;
const Status = grpc.status;

function loadService() {
  const definition = protoLoader.loadFileDescriptorSetFromBuffer(
    fs.readFileSync(descriptorPath), LOADER_OPTIONS);
  return grpc.loadPackageDefinition(definition).inference.GRPCInferenceService;
}

const Service = loadService();

function connect(options = {}) {
  return new Service(address, grpc.credentials.createInsecure(), options);
}

function check(condition, message) {
  if (!condition) throw new Error(message);
}

function unary(client, method, request, { metadata, deadline } = {}) {
  return new Promise((resolve, reject) => {
    const options = deadline === undefined ? {} : { deadline: Date.now() + deadline };
    client[method](request, metadata || new grpc.Metadata(), options, (error, response) => {
      if (error) reject(error);
      else resolve(response);
    });
  });
}

// The call's outcome as data: {code, details} on error, {code: 0, response} otherwise.
async function outcome(promise) {
  try {
    return { code: Status.OK, response: await promise };
  } catch (error) {
    if (error.code === undefined) throw error;
    return { code: error.code, details: error.details };
  }
}

// --- tensors ---------------------------------------------------------------------

function f32Buffer(values) {
  return Buffer.from(Float32Array.from(values).buffer);
}

function i32Buffer(values) {
  return Buffer.from(Int32Array.from(values).buffer);
}

function bytesBuffer(strings) {
  return Buffer.concat(strings.map((s) => {
    const body = Buffer.from(s);
    const prefix = Buffer.alloc(4);
    prefix.writeUInt32LE(body.length);
    return Buffer.concat([prefix, body]);
  }));
}

function decode(buffer, datatype) {
  const out = [];
  if (datatype === 'BYTES') {
    for (let at = 0; at < buffer.length;) {
      const size = buffer.readUInt32LE(at);
      out.push(buffer.subarray(at + 4, at + 4 + size).toString());
      at += 4 + size;
    }
    return out;
  }
  const [width, read] = {
    FP32: [4, 'readFloatLE'], INT32: [4, 'readInt32LE'], UINT32: [4, 'readUInt32LE'],
  }[datatype];
  for (let at = 0; at < buffer.length; at += width) out.push(buffer[read](at));
  return out;
}

// Every output of a ModelInferResponse as {name: {datatype, shape, values}}.
function outputsOf(response) {
  const result = {};
  response.outputs.forEach((output, i) => {
    result[output.name] = {
      datatype: output.datatype,
      shape: output.shape.map(Number),
      values: decode(response.raw_output_contents[i], output.datatype),
    };
  });
  return result;
}

function addSubRequest(a, b, id = '') {
  return {
    model_name: 'add_sub', id,
    inputs: [
      { name: 'INPUT0', datatype: 'FP32', shape: [4] },
      { name: 'INPUT1', datatype: 'FP32', shape: [4] },
    ],
    raw_input_contents: [f32Buffer(a), f32Buffer(b)],
  };
}

function identityRequest(model, values, id = '') {
  return {
    model_name: model, id,
    inputs: [{ name: 'INPUT0', datatype: 'FP32', shape: [1, values.length] }],
    raw_input_contents: [f32Buffer(values)],
  };
}

function repeatRequest(values, delays, id, parameters) {
  const inputs = [{ name: 'IN', datatype: 'INT32', shape: [values.length] }];
  const raw = [i32Buffer(values)];
  if (delays) {
    inputs.push({ name: 'DELAY', datatype: 'UINT32', shape: [delays.length] });
    raw.push(Buffer.from(Uint32Array.from(delays).buffer));
  }
  return { model_name: 'repeat_decoupled', id, inputs, raw_input_contents: raw,
           parameters: parameters || [] };
}

// A protobuf map from a descriptor set comes as its wire form, a list of {key, value}
// entries (protobufjs builds map fields only from .proto text).
function parameter(entries, key) {
  const entry = (entries || []).find((e) => e.key === key);
  return entry ? entry.value : undefined;
}

// --- streams ---------------------------------------------------------------------

// A ModelStreamInfer call: collects every response and resolves with the call's end.
function openStream(client, { metadata, deadline } = {}) {
  const options = deadline === undefined ? {} : { deadline: Date.now() + deadline };
  const call = client.ModelStreamInfer(metadata || new grpc.Metadata(), options);
  const responses = [];
  const listeners = [];
  call.on('data', (message) => {
    responses.push(message);
    listeners.splice(0).forEach((listener) => listener());
  });
  const ended = new Promise((resolve) => {
    call.on('error', (error) => resolve({ code: error.code, details: error.details }));
    call.on('status', (status) => {
      if (status.code === Status.OK) resolve({ code: Status.OK, details: status.details });
    });
  });
  // Resolves once `count` responses have arrived; rejects if the call ends before.
  const received = (count) => new Promise((resolve, reject) => {
    const test = () => (responses.length >= count ? resolve() : listeners.push(test));
    test();
    ended.then((end) => reject(new Error(
      `stream ended (${end.code}: ${end.details}) after ${responses.length} responses`)));
  });
  return { call, responses, ended, received };
}

function streamSummary(response) {
  const infer = response.infer_response;
  const final = parameter(infer.parameters, 'triton_final_response');
  return {
    error: response.error_message,
    id: infer.id,
    final: final ? final.bool_param : null,
    outputs: infer.outputs.length ? outputsOf(infer) : {},
  };
}

// --- scenarios -------------------------------------------------------------------

const scenarios = {
  async health() {
    const client = connect();
    const live = await unary(client, 'ServerLive', {});
    const ready = await unary(client, 'ServerReady', {});
    const modelReady = await unary(client, 'ModelReady', { name: 'add_sub' });
    const server = await unary(client, 'ServerMetadata', {});
    const model = await unary(client, 'ModelMetadata', { name: 'add_sub' });
    client.close();
    return {
      live: live.live, ready: ready.ready, model_ready: modelReady.ready,
      server_name: server.name, extensions: server.extensions,
      model: { name: model.name, versions: model.versions, platform: model.platform,
               inputs: model.inputs.map((t) => ({ name: t.name, datatype: t.datatype,
                                                  shape: t.shape.map(Number) })) },
    };
  },

  async unary_raw() {
    const client = connect();
    const addSub = await unary(client, 'ModelInfer',
                               addSubRequest([1, 2, 3, 4], [0.5, 0.25, -1, 8], 'raw-1'));
    const strings = await unary(client, 'ModelInfer', {
      model_name: 'identity_int32_bytes',
      inputs: [{ name: 'INPUT0', datatype: 'INT32', shape: [3] },
               { name: 'INPUT1', datatype: 'BYTES', shape: [3] }],
      raw_input_contents: [i32Buffer([-7, 0, 2147483647]),
                           bytesBuffer(['', 'héllo', 'x'.repeat(300)])],
    });
    const unknown = await outcome(unary(client, 'ModelInfer', {
      ...addSubRequest([0, 0, 0, 0], [0, 0, 0, 0]), model_name: 'no_such_model' }));
    client.close();
    return {
      add_sub: { id: addSub.id, model_name: addSub.model_name, outputs: outputsOf(addSub) },
      identity_int32_bytes: outputsOf(strings),
      unknown_model: unknown,
    };
  },

  async unary_typed() {
    const client = connect();
    const addSub = await unary(client, 'ModelInfer', {
      model_name: 'add_sub', id: 'typed-1',
      inputs: [
        { name: 'INPUT0', datatype: 'FP32', shape: [4],
          contents: { fp32_contents: [1.5, -2, 3, 1e6] } },
        { name: 'INPUT1', datatype: 'FP32', shape: [4],
          contents: { fp32_contents: [0.5, 2, -3, 1] } },
      ],
    });
    const strings = await unary(client, 'ModelInfer', {
      model_name: 'identity_int32_bytes',
      inputs: [
        { name: 'INPUT0', datatype: 'INT32', shape: [4],
          contents: { int_contents: [-2147483648, -1, 0, 42] } },
        { name: 'INPUT1', datatype: 'BYTES', shape: [4],
          contents: { bytes_contents: ['a', '', 'ünï', 'end'].map((s) => Buffer.from(s)) } },
      ],
    });
    client.close();
    return { add_sub: outputsOf(addSub), identity_int32_bytes: outputsOf(strings) };
  },

  async large() {
    const elements = (32 * MiB) / 4;
    const values = new Float32Array(elements);
    for (let i = 0; i < elements; i++) values[i] = (i % 65536) * 0.5;
    const input = Buffer.from(values.buffer);
    const client = connect({ 'grpc.max_receive_message_length': 64 * MiB,
                             'grpc.max_send_message_length': 64 * MiB });
    const request = {
      model_name: 'identity_fp32',
      inputs: [{ name: 'INPUT0', datatype: 'FP32', shape: [1, elements] }],
      raw_input_contents: [input],
    };
    const rounds = [];
    for (let round = 0; round < 2; round++) {
      const started = Date.now();
      const response = await unary(client, 'ModelInfer', request);
      const output = response.raw_output_contents[0];
      rounds.push({
        ms: Date.now() - started,
        shape: response.outputs[0].shape.map(Number),
        bytes: output.length,
        equal: output.equals(input),
        sha256: crypto.createHash('sha256').update(output).digest('hex'),
      });
    }
    // A client that keeps grpc-js's default 4 MiB receive limit resets the stream in the
    // middle of the 32 MiB answer; the connection goes on.
    const small = connect();
    const refused = await outcome(unary(small, 'ModelInfer', request));
    const afterReset = await unary(small, 'ModelInfer', identityRequest('identity_fp32', [9]));
    small.close();
    client.close();
    return { request_bytes: input.length,
             input_sha256: crypto.createHash('sha256').update(input).digest('hex'),
             rounds, default_limit: { code: refused.code,
                                      after: decode(afterReset.raw_output_contents[0], 'FP32') } };
  },

  async gzip() {
    const results = {};
    for (const [label, algorithm] of [['gzip', 2], ['deflate', 1]]) {
      const before = compressed[label];
      const client = connect({ 'grpc.default_compression_algorithm': algorithm });
      const sums = [];
      for (let i = 0; i < 5; i++) {
        const response = await unary(client, 'ModelInfer',
                                     addSubRequest([i, 1, 2, 3], [1, 1, 1, i]));
        sums.push(outputsOf(response).OUTPUT0.values);
      }
      // 1 MiB that compresses well, and so crosses many DATA frames uncompressed.
      const big = Array.from({ length: MiB / 4 }, (_, i) => i % 7);
      const echoed = await unary(client, 'ModelInfer', identityRequest('identity_fp32', big));
      const echoEqual = echoed.raw_output_contents[0].equals(f32Buffer(big));
      const stream = openStream(client);
      stream.call.write(repeatRequest([4, 5, 6], null, 'z'));
      stream.call.end();
      const end = await stream.ended;
      client.close();
      results[label] = {
        sums, echo_equal: echoEqual,
        stream: { code: end.code, responses: stream.responses.map(streamSummary) },
        messages_compressed: compressed[label] - before,
      };
    }
    return results;
  },

  // Against a server started with --grpc-infer-response-compression-level.
  async compressed_responses() {
    const client = connect();
    const big = Array.from({ length: MiB / 4 }, (_, i) => i % 7);
    const echoed = await unary(client, 'ModelInfer', identityRequest('identity_fp32', big));
    const stream = openStream(client);
    stream.call.write(repeatRequest([4, 5, 6], null, 'z'));
    stream.call.end();
    const end = await stream.ended;
    client.close();
    return { echo_equal: echoed.raw_output_contents[0].equals(f32Buffer(big)),
             stream: { code: end.code, responses: stream.responses.map(streamSummary) },
             inflaters };
  },

  async deadline() {
    const client = connect();
    // 10 ms of execution against a 2 ms deadline.
    const unaryLate = await outcome(unary(client, 'ModelInfer',
                                          identityRequest('batched_identity_delay', [1, 2]),
                                          { deadline: 2 }));
    // One response at once, the next 6 s later, against a 2.5 s deadline: margins wide
    // enough for a loaded machine.
    const started = Date.now();
    const stream = openStream(client, { deadline: 2500 });
    stream.call.write(repeatRequest([10, 11, 12], [0, 6000, 6000], 'd'));
    const end = await stream.ended;
    const streamMs = Date.now() - started;
    const roomy = await unary(client, 'ModelInfer', addSubRequest([1, 1, 1, 1], [2, 2, 2, 2]),
                              { deadline: 30000 });
    const live = await unary(client, 'ServerLive', {});
    client.close();
    return {
      unary: { code: unaryLate.code },
      stream: { code: end.code, ms: streamMs,
                responses: stream.responses.map(streamSummary) },
      within_deadline: outputsOf(roomy),
      live_after: live.live,
    };
  },

  async cancel() {
    const client = connect();
    // A call cancelled after it was sent (its answer takes 10 ms or more), while its
    // neighbour on the same connection goes on. Node runs due timers before it reads
    // the socket, so the cancel always comes first.
    const neighbour = unary(client, 'ModelInfer', identityRequest('batched_identity_delay', [3]));
    const cancelled = new Promise((resolve) => {
      const call = client.ModelInfer(identityRequest('batched_identity_delay', [4]),
                                     (error) => resolve(error));
      setTimeout(() => call.cancel(), 2);
    });
    const cancelledWith = await cancelled;
    const neighbourAnswer = await neighbour;

    const values = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9];
    const stream = openStream(client);
    const started = Date.now();
    stream.call.write(repeatRequest(values, values.map(() => 100), 'c'));
    await stream.received(1);
    stream.call.cancel();
    const end = await stream.ended;
    const streamMs = Date.now() - started;

    const after = openStream(client);
    after.call.write(repeatRequest([7, 8, 9], null, 'after'));
    after.call.end();
    const afterEnd = await after.ended;
    client.close();
    return {
      unary: { code: cancelledWith ? cancelledWith.code : Status.OK,
               uncancelled_neighbour: outputsOf(neighbourAnswer) },
      stream: { code: end.code, ms: streamMs, received: stream.responses.length,
                first: streamSummary(stream.responses[0]) },
      after: { code: afterEnd.code, responses: after.responses.map(streamSummary) },
    };
  },

  async binary_metadata() {
    const client = connect();
    const metadata = () => {
      const m = new grpc.Metadata();
      m.set('x-trace-bin', Buffer.from([0, 1, 2, 0xfe, 0xff, 0x80, 0x0a, 0x0d]));
      m.add('x-multi-bin', Buffer.from('first'));
      m.add('x-multi-bin', Buffer.from([0xc3, 0x28]));  // not UTF-8
      m.set('x-large-bin', crypto.randomBytes(8192));
      m.set('x-text', 'plain value');
      return m;
    };
    const refused = await outcome(unary(client, 'RepositoryIndex', {}, { metadata: metadata() }));
    const admitted = metadata();
    admitted.set('triton-grpc-protocol-admin-key', 'admin-value');
    const index = await unary(client, 'RepositoryIndex', {}, { metadata: admitted });
    const infer = await unary(client, 'ModelInfer', addSubRequest([1, 2, 3, 4], [4, 3, 2, 1]),
                              { metadata: metadata() });
    const stream = openStream(client, { metadata: metadata() });
    stream.call.write(repeatRequest([1, 2], null, 'm'));
    stream.call.end();
    const end = await stream.ended;
    client.close();
    return {
      without_key: refused,
      with_key: { code: Status.OK, models: index.models.map((m) => m.name).sort() },
      infer: outputsOf(infer),
      stream: { code: end.code, responses: stream.responses.map(streamSummary) },
    };
  },

  async concurrent() {
    const calls = 500;
    const client = connect();
    await unary(client, 'ServerLive', {});  // connected before the burst
    const started = Date.now();
    const answers = await Promise.all(Array.from({ length: calls }, (_, i) => {
      const values = Array.from({ length: 16 }, (_, k) => i + k / 16);
      return outcome(unary(client, 'ModelInfer',
                           identityRequest('identity_fp32', values, `call-${i}`)))
        .then((result) => ({ i, values, result }));
    }));
    const ms = Date.now() - started;
    let correct = 0;
    const failures = [];
    for (const { i, values, result } of answers) {
      if (result.code !== Status.OK) {
        failures.push({ i, code: result.code, details: result.details });
        continue;
      }
      const echoed = decode(result.response.raw_output_contents[0], 'FP32');
      if (result.response.id === `call-${i}` && echoed.length === 16
          && echoed.every((v, k) => v === Math.fround(values[k]))) correct += 1;
      else failures.push({ i, id: result.response.id, echoed: echoed.slice(0, 4) });
    }
    client.close();
    return { calls, correct, failures: failures.slice(0, 10), failed: failures.length, ms };
  },

  async stream() {
    const client = connect();
    const stream = openStream(client);
    stream.call.write(repeatRequest([1, 2, 3], [5, 5, 5], 'a'));
    stream.call.write(repeatRequest([10, 20], null, 'b', [
      { key: 'triton_enable_empty_final_response', value: { bool_param: true } }]));
    stream.call.write(repeatRequest([100, 200, 300, 400], [1, 1, 1, 1], 'c'));
    stream.call.write({ ...repeatRequest([5], null, 'bad'), model_name: 'no_such_model' });
    await stream.received(1);
    stream.call.end();
    const end = await stream.ended;
    client.close();
    return { code: end.code, responses: stream.responses.map(streamSummary) };
  },
};

async function main() {
  const scenario = scenarios[scenarioName];
  check(scenario, `unknown scenario '${scenarioName}' (known: ${Object.keys(scenarios)})`);
  const result = await scenario();
  process.stdout.write(JSON.stringify({ scenario: scenarioName, result }) + '\n');
}

main().then(() => process.exit(0), (error) => {
  process.stdout.write(JSON.stringify({ scenario: scenarioName, error: String(error.stack || error),
                                        code: error.code, details: error.details }) + '\n');
  process.exit(1);
});
