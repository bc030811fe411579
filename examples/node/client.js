#!/usr/bin/env node
// A fedlearn client in Node.js: Join, wait for a TRAIN task, push an update, print status.
//
//   cd examples/node && npm ci
//   node client.js --coordinator=127.0.0.1:50051
//
// Loads proto/fedlearn/v1/coordinator.proto with @grpc/proto-loader. It does no real
// training: the update is a small step of plain weight decay (delta = -step * w;
// --step=0 pushes a zero delta), chunked exactly as the contract says (see
// common/tensor_codec.cc, ChunkWriter). On success it prints one JSON object (the round
// it trained, the coordinator's phase and round history) and exits 0; on failure it
// prints a message to stderr and exits non-zero.
'use strict';

const path = require('path');

const MAX_CHUNK_BYTES = 1 << 20;  // the contract's limit on TensorChunk.data

function parseArgs(argv) {
  const args = {
    coordinator: '127.0.0.1:50051',
    proto: path.join(__dirname, '..', '..', 'proto'),
    join_token: '',
    display_name: 'node-example',
    num_examples: 100,
    step: 0.01,
    chunk_bytes: MAX_CHUNK_BYTES,
    timeout: 45,
  };
  for (let i = 0; i < argv.length; ++i) {
    let a = argv[i];
    if (a === '--help' || a === '-h') {
      console.log('usage: node client.js [--coordinator=HOST:PORT] [--proto=DIR] ' +
                  '[--join_token=T] [--display_name=N] [--num_examples=N] [--step=S] ' +
                  '[--chunk_bytes=N] [--timeout=SECONDS]');
      process.exit(0);
    }
    if (!a.startsWith('--')) throw new ClientError(`unexpected argument ${a}`);
    a = a.slice(2);
    let value;
    const eq = a.indexOf('=');
    if (eq >= 0) {
      value = a.slice(eq + 1);
      a = a.slice(0, eq);
    } else {
      value = argv[++i];
    }
    if (!(a in args) || value === undefined) throw new ClientError(`bad flag --${a}`);
    args[a] = typeof args[a] === 'number' ? Number(value) : value;
  }
  return args;
}

class ClientError extends Error {}

// ---------------------------------------------------------------------------------------
// CRC-32C (Castagnoli), reflected polynomial 0x82F63B78, table driven.

const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let i = 0; i < 256; ++i) {
    let crc = i;
    for (let k = 0; k < 8; ++k) crc = crc & 1 ? (crc >>> 1) ^ 0x82F63B78 : crc >>> 1;
    table[i] = crc >>> 0;
  }
  return table;
})();

// CRC-32C of A+data given crc = CRC-32C(A) (0 for the empty prefix).
function crc32cExtend(crc, data) {
  crc = (crc ^ 0xFFFFFFFF) >>> 0;
  for (let i = 0; i < data.length; ++i) crc = CRC_TABLE[(crc ^ data[i]) & 0xFF] ^ (crc >>> 8);
  return (crc ^ 0xFFFFFFFF) >>> 0;
}
const crc32c = (data) => crc32cExtend(0, data);
if (crc32c(Buffer.from('123456789')) !== 0xE3069283) throw new Error('CRC-32C self-test failed');

// ---------------------------------------------------------------------------------------
// Tensors on the wire.

const numel = (shape) => shape.reduce((n, d) => n * Number(d), 1);
const sameShape = (a, b) => a.length === b.length && a.every((d, i) => Number(d) === Number(b[i]));

// Checks the chunks against the model spec; returns one Float32Array per tensor.
function reassemble(spec, chunks) {
  const tensors = [];
  let next = 0;
  for (const t of spec.tensors) {
    const total = numel(t.shape) * 4;
    const payload = Buffer.alloc(total);
    let have = 0;
    let running = 0;
    for (;;) {
      const c = chunks[next++];
      if (!c) throw new ClientError(`weights ended before tensor ${t.name} was complete`);
      if (c.name !== t.name) throw new ClientError(`expected a chunk of ${t.name}, got ${c.name}`);
      if (!sameShape(c.shape, t.shape)) {
        throw new ClientError(`${t.name}: shape [${c.shape}], want [${t.shape}]`);
      }
      if (c.dtype !== 'DTYPE_FLOAT32' || c.encoding !== 'ENCODING_DENSE') {
        throw new ClientError(`${t.name}: ${c.dtype}/${c.encoding}, want dense float32`);
      }
      if (Number(c.total_bytes) !== total) {
        throw new ClientError(`${t.name}: total_bytes ${c.total_bytes}, want ${total}`);
      }
      if (Number(c.offset) !== have) {
        throw new ClientError(`${t.name}: chunk at offset ${c.offset}, want ${have}`);
      }
      if (c.data.length > MAX_CHUNK_BYTES || have + c.data.length > total) {
        throw new ClientError(`${t.name}: chunk of ${c.data.length} bytes too large`);
      }
      if (crc32c(c.data) !== c.chunk_crc32c) {
        throw new ClientError(`${t.name}: chunk CRC-32C mismatch at offset ${c.offset}`);
      }
      running = crc32cExtend(running, c.data);
      c.data.copy(payload, have);
      have += c.data.length;
      if (c.last) {
        if (have !== total) throw new ClientError(`${t.name}: last chunk at ${have} of ${total} bytes`);
        if (running !== c.tensor_crc32c) throw new ClientError(`${t.name}: tensor CRC-32C mismatch`);
        break;
      }
    }
    const values = new Float32Array(total / 4);
    for (let i = 0; i < values.length; ++i) values[i] = payload.readFloatLE(i * 4);
    if (!values.every(Number.isFinite)) throw new ClientError(`${t.name}: weights not all finite`);
    tensors.push(values);
  }
  if (next !== chunks.length) throw new ClientError(`${chunks.length - next} chunks after the last tensor`);
  return tensors;
}

// TensorChunk messages for `tensors`, as ChunkWriter makes them.
function* makeChunks(spec, tensors, chunkBytes) {
  chunkBytes = Math.max(4, Math.min(chunkBytes & ~3, MAX_CHUNK_BYTES));
  for (let k = 0; k < spec.tensors.length; ++k) {
    const t = spec.tensors[k];
    const values = tensors[k];
    const payload = Buffer.alloc(values.length * 4);
    for (let i = 0; i < values.length; ++i) payload.writeFloatLE(values[i], i * 4);
    const total = payload.length;
    let offset = 0;
    let running = 0;
    for (;;) {  // a zero-size tensor still sends one (empty, last) chunk
      const data = payload.subarray(offset, Math.min(offset + chunkBytes, total));
      const crc = crc32c(data);
      running = offset === 0 ? crc : crc32cExtend(running, data);
      const last = offset + data.length === total;
      yield {
        name: t.name, shape: t.shape, dtype: 'DTYPE_FLOAT32', encoding: 'ENCODING_DENSE',
        total_bytes: total, offset, data, chunk_crc32c: crc, last,
        tensor_crc32c: last ? running : 0,
      };
      offset += data.length;
      if (last) break;
    }
  }
}

// ---------------------------------------------------------------------------------------
// The flow.

const rpcError = (what, e) => new ClientError(`${what} failed: ${e.code !== undefined ?
  require('@grpc/grpc-js').status[e.code] : ''}: ${e.details || e.message}`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const secondsFromNow = (s) => new Date(Date.now() + s * 1000);

function unary(client, method, request, metadata, what) {
  return new Promise((resolve, reject) => {
    client[method](request, metadata, { deadline: secondsFromNow(10) }, (err, response) =>
      err ? reject(rpcError(what || method, err)) : resolve(response));
  });
}

function readStream(call) {
  return new Promise((resolve, reject) => {
    const messages = [];
    call.on('data', (m) => messages.push(m));
    call.on('error', reject);
    call.on('end', () => resolve(messages));
  });
}

async function run(args) {
  let grpc, protoLoader;
  try {
    grpc = require('@grpc/grpc-js');
    protoLoader = require('@grpc/proto-loader');
  } catch (e) {
    throw new ClientError(`cannot load @grpc/grpc-js / @grpc/proto-loader (${e.message}); ` +
                          `run npm ci in ${__dirname}`);
  }
  const definition = protoLoader.loadSync('fedlearn/v1/coordinator.proto', {
    includeDirs: [args.proto], keepCase: true, longs: String, enums: String,
    defaults: true, oneofs: true,
  });
  const v1 = grpc.loadPackageDefinition(definition).fedlearn.v1;
  const client = new v1.Coordinator(args.coordinator, grpc.credentials.createInsecure());
  const deadline = Date.now() + args.timeout * 1000;
  await new Promise((resolve, reject) => client.waitForReady(
    secondsFromNow(Math.min(10, args.timeout)),
    (err) => err ? reject(new ClientError(`cannot connect to ${args.coordinator}`)) : resolve()));

  const joined = await unary(client, 'Join', {
    join_token: args.join_token, display_name: args.display_name,
    num_train_examples: args.num_examples,
  }, new grpc.Metadata());
  const md = new grpc.Metadata();
  md.set('authorization', `Bearer ${joined.session_token}`);
  const spec = joined.model;
  console.error(`joined as ${joined.client_id}, run ${joined.run_id}, model ${spec.name} ` +
                `(${spec.num_parameters} parameters)`);

  // Poll until TRAIN arrives.
  let task, messages;
  for (;;) {
    if (Date.now() > deadline) throw new ClientError(`no TRAIN task within ${args.timeout} s`);
    try {
      messages = await readStream(client.RequestUpdate(
        { client_id: joined.client_id, max_wait_ms: 5000 }, md,
        { deadline: secondsFromNow(30) }));
    } catch (e) {
      if (e.code === grpc.status.UNAVAILABLE) { await sleep(500); continue; }
      throw rpcError('RequestUpdate', e);
    }
    if (!messages.length || messages[0].payload !== 'task') {
      throw new ClientError('RequestUpdate: the first message is not a task');
    }
    task = messages[0].task;
    if (task.type === 'TASK_TYPE_WAIT') {
      await sleep(Math.max(Number(task.retry_after_ms), 10));
      continue;
    }
    if (task.type === 'TASK_TYPE_DONE') {
      throw new ClientError('the run ended (DONE) before this client got a TRAIN task');
    }
    if (task.type === 'TASK_TYPE_TRAIN') break;
    throw new ClientError(`unexpected task ${task.type}`);
  }
  const chunks = messages.slice(1).map((m) => {
    if (m.payload !== 'chunk') throw new ClientError('RequestUpdate: a second task header in one stream');
    return m.chunk;
  });
  if (task.num_tensors && task.num_tensors !== spec.tensors.length) {
    throw new ClientError(`task announces ${task.num_tensors} tensors, model has ${spec.tensors.length}`);
  }
  const weights = reassemble(spec, chunks);
  const received = chunks.reduce((n, c) => n + c.data.length, 0);
  if (received !== Number(task.payload_bytes)) {
    throw new ClientError(`received ${received} payload bytes, task announced ${task.payload_bytes}`);
  }
  console.error(`TRAIN round ${task.round}: ${chunks.length} chunks, ${received} bytes, verified`);

  // "Training": one step of weight decay, delta = -step * w.
  const delta = weights.map((w) => w.map((x) => -args.step * x));

  // Send the header, wait for the coordinator's initial metadata (the go-ahead), then the
  // chunks; a rejected push finishes before any chunk is sent.
  const pushed = await new Promise((resolve, reject) => {
    let finished = false;
    const call = client.PushGradient(md, { deadline: secondsFromNow(30) }, (err, response) => {
      finished = true;
      err ? reject(rpcError('PushGradient', err)) : resolve(response);
    });
    call.on('metadata', async () => {
      for (const chunk of makeChunks(spec, delta, args.chunk_bytes)) {
        if (finished) return;
        if (!call.write({ chunk })) await new Promise((r) => call.once('drain', r));
      }
      call.end();
    });
    call.write({
      header: {
        client_id: joined.client_id, round: task.round, num_examples: args.num_examples,
        train_loss: 1.0, train_accuracy: 0.0, encoding: 'ENCODING_DENSE',
      },
    });
  });
  console.error(`update accepted in round ${pushed.round} ` +
                `(${pushed.accepted_this_round} accepted so far)`);

  // The round closes once enough clients have pushed; give it a moment to show up.
  let status;
  for (;;) {
    status = await unary(client, 'GetStatus', {}, md);
    if (status.history.some((r) => r.round === pushed.round && !r.evaluation) ||
        Date.now() > deadline) break;
    await sleep(200);
  }
  console.log(JSON.stringify({
    client_id: joined.client_id,
    run_id: status.run_id,
    trained_round: task.round,
    accepted_this_round: pushed.accepted_this_round,
    phase: status.phase,
    round: status.round,
    history: status.history,
  }, null, 2));
  client.close();
}

(async () => {
  try {
    await run(parseArgs(process.argv.slice(2)));
  } catch (e) {
    console.error(`client.js: error: ${e instanceof ClientError ? e.message : e.stack}`);
    process.exit(1);
  }
})();
