#!/usr/bin/env node
// Lists the coordinator's services and describes one of them through gRPC server
// reflection alone: no fedlearn .proto file is read. Then (unless --no_call) calls
// GetStatus on fedlearn.v1.Coordinator with the descriptor obtained by reflection.
//
//   cd examples/node && npm ci
//   node reflection.js --coordinator=127.0.0.1:50051 [--service=fedlearn.v1.Coordinator]
//
// gRPC 1.51 (Debian 12) serves grpc.reflection.v1alpha.ServerReflection. The schema of
// the reflection service itself is embedded below (the subset of
// grpc/reflection/v1alpha/reflection.proto this program uses); the FileDescriptorProto
// bytes the server returns are decoded with protobufjs/ext/descriptor.
'use strict';

const REFLECTION_PROTO = `
syntax = "proto3";
package grpc.reflection.v1alpha;
service ServerReflection {
  rpc ServerReflectionInfo(stream ServerReflectionRequest)
      returns (stream ServerReflectionResponse);
}
message ServerReflectionRequest {
  string host = 1;
  oneof message_request {
    string file_by_filename = 3;
    string file_containing_symbol = 4;
    string list_services = 7;
  }
}
message ServerReflectionResponse {
  string valid_host = 1;
  ServerReflectionRequest original_request = 2;
  oneof message_response {
    FileDescriptorResponse file_descriptor_response = 4;
    ListServiceResponse list_services_response = 6;
    ErrorResponse error_response = 7;
  }
}
message FileDescriptorResponse { repeated bytes file_descriptor_proto = 1; }
message ListServiceResponse { repeated ServiceResponse service = 1; }
message ServiceResponse { string name = 1; }
message ErrorResponse { int32 error_code = 1; string error_message = 2; }
`;

class ClientError extends Error {}

function parseArgs(argv) {
  const args = { coordinator: '127.0.0.1:50051', service: 'fedlearn.v1.Coordinator', call: true };
  for (const a of argv) {
    let m;
    if ((m = a.match(/^--coordinator=(.+)$/))) args.coordinator = m[1];
    else if ((m = a.match(/^--service=(.+)$/))) args.service = m[1];
    else if (a === '--no_call') args.call = false;
    else if (a === '--help' || a === '-h') {
      console.log('usage: node reflection.js [--coordinator=HOST:PORT] [--service=NAME] [--no_call]');
      process.exit(0);
    } else throw new ClientError(`unexpected argument ${a}`);
  }
  return args;
}

// One reflection stream; ask() sends a request and resolves with its response (the
// server answers requests in order).
class Reflection {
  constructor(grpc, stub) {
    this.call = stub.ServerReflectionInfo({ deadline: new Date(Date.now() + 20000) });
    this.waiting = [];
    this.call.on('data', (r) => this.waiting.shift().resolve(r));
    this.call.on('error', (e) => {
      for (const w of this.waiting.splice(0)) {
        w.reject(new ClientError(`ServerReflectionInfo failed: ${grpc.status[e.code]}: ${e.details}`));
      }
    });
  }
  ask(request) {
    return new Promise((resolve, reject) => {
      this.waiting.push({ resolve, reject });
      this.call.write(request);
    });
  }
  close() { this.call.end(); }
}

function checkError(response) {
  if (response.message_response === 'error_response') {
    const e = response.error_response;
    throw new ClientError(`reflection error ${e.error_code}: ${e.error_message}`);
  }
  return response;
}

async function run(args) {
  let grpc, protoLoader, protobuf, descriptor;
  try {
    grpc = require('@grpc/grpc-js');
    protoLoader = require('@grpc/proto-loader');
    protobuf = require('protobufjs');
    descriptor = require('protobufjs/ext/descriptor');
  } catch (e) {
    throw new ClientError(`cannot load the npm modules (${e.message}); run npm ci in ${__dirname}`);
  }
  const loaderOptions = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true };
  const reflectionDef = protoLoader.fromJSON(protobuf.parse(REFLECTION_PROTO, { keepCase: true }).root.toJSON(),
                                             loaderOptions);
  const ReflectionStub =
      grpc.loadPackageDefinition(reflectionDef).grpc.reflection.v1alpha.ServerReflection;
  const stub = new ReflectionStub(args.coordinator, grpc.credentials.createInsecure());
  await new Promise((resolve, reject) => stub.waitForReady(
    new Date(Date.now() + 10000),
    (err) => err ? reject(new ClientError(`cannot connect to ${args.coordinator}`)) : resolve()));
  const reflection = new Reflection(grpc, stub);

  // list_services
  const listed = checkError(await reflection.ask({ list_services: '' }));
  const services = listed.list_services_response.service.map((s) => s.name);
  console.log('services:');
  for (const s of services) console.log(`  ${s}`);
  if (!services.includes(args.service)) {
    throw new ClientError(`${args.service} is not among the services the server lists`);
  }

  // file_containing_symbol, then the files it imports (file_by_filename), by name.
  const files = new Map();  // name -> { bytes, proto }
  const addFiles = (response) => {
    for (const bytes of checkError(response).file_descriptor_response.file_descriptor_proto) {
      const proto = descriptor.FileDescriptorProto.decode(bytes);
      if (!files.has(proto.name)) files.set(proto.name, { bytes, proto });
    }
  };
  addFiles(await reflection.ask({ file_containing_symbol: args.service }));
  for (let missing; (missing = [...files.values()].flatMap((f) => f.proto.dependency || [])
                                 .filter((d) => !files.has(d))).length;) {
    for (const name of missing) addFiles(await reflection.ask({ file_by_filename: name }));
  }
  reflection.close();

  // Describe the service from its FileDescriptorProto.
  let found;
  for (const { proto } of files.values()) {
    for (const s of proto.service || []) {
      if ((proto.package ? `${proto.package}.${s.name}` : s.name) === args.service) found = { proto, s };
    }
  }
  if (!found) throw new ClientError(`no descriptor for ${args.service} in the files returned`);
  console.log(`\n${args.service} (from ${found.proto.name}, ${files.size} file(s) by reflection):`);
  console.log(`service ${found.s.name} {`);
  for (const m of found.s.method) {
    const input = `${m.clientStreaming ? 'stream ' : ''}${m.inputType}`;
    const output = `${m.serverStreaming ? 'stream ' : ''}${m.outputType}`;
    console.log(`  rpc ${m.name} ( ${input} ) returns ( ${output} );`);
  }
  console.log('}');

  if (!args.call) return;
  // Bonus: call GetStatus with the descriptors obtained by reflection. A
  // FileDescriptorSet is `repeated FileDescriptorProto file = 1`: frame each file's bytes.
  const parts = [];
  for (const { bytes } of files.values()) {
    const len = [];
    for (let n = bytes.length; ; n >>>= 7) {
      if (n < 0x80) { len.push(n); break; }
      len.push((n & 0x7f) | 0x80);
    }
    parts.push(Buffer.from([0x0a, ...len]), Buffer.from(bytes));
  }
  const dynamicDef = protoLoader.loadFileDescriptorSetFromBuffer(Buffer.concat(parts), loaderOptions);
  let Service = grpc.loadPackageDefinition(dynamicDef);
  for (const part of args.service.split('.')) Service = Service && Service[part];
  if (!Service || !Service.service || !Service.service.GetStatus) {
    throw new ClientError(`${args.service} has no GetStatus to call`);
  }
  const client = new Service(args.coordinator, grpc.credentials.createInsecure());
  const status = await new Promise((resolve, reject) => client.GetStatus(
    {}, { deadline: new Date(Date.now() + 10000) },
    (err, r) => err ? reject(new ClientError(`GetStatus failed: ${grpc.status[err.code]}: ${err.details}`))
                    : resolve(r)));
  console.log(`\nGetStatus (dynamic, via reflection): ${JSON.stringify({
    run_id: status.run_id, phase: status.phase, round: status.round,
    model: status.model && status.model.name, rounds_in_history: status.history.length,
    clients: status.clients.length,
  })}`);
  client.close();
}

(async () => {
  try {
    await run(parseArgs(process.argv.slice(2)));
    process.exit(0);
  } catch (e) {
    console.error(`reflection.js: error: ${e instanceof ClientError ? e.message : e.stack}`);
    process.exit(1);
  }
})();
