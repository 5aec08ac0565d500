// A STOMP client written with stompit (npm), driven by tests/test_stomp_node.py:
//   node stomp_client.js produce PORT DESTINATION COUNT   sends COUNT messages, each with a receipt
//   node stomp_client.js consume PORT DESTINATION COUNT   receives COUNT, acks each, prints them
// Every message received is printed as one JSON line {body, headers}; failures exit non-zero.
'use strict';
const stompit = require('stompit');

const [mode, port, destination, countText] = process.argv.slice(2);
const count = parseInt(countText, 10);
const fail = (what, err) => {
  console.error(`${what}: ${err && err.message ? err.message : err}`);
  process.exit(2);
};
setTimeout(() => fail('timeout', 'no end within 60 s'), 60000).unref();

stompit.connect(
  { host: '127.0.0.1', port: Number(port), connectHeaders: { host: '/', 'accept-version': '1.2' } },
  (err, client) => {
    if (err) return fail('connect', err);
    client.on('error', (e) => fail('client', e));
    if (mode === 'produce') {
      let receipts = 0;
      for (let i = 0; i < count; i++) {
        const frame = client.send(
          { destination, 'content-type': 'text/plain', 'from-node': 'yes', priority: '6' },
          { onReceipt: () => { if (++receipts === count) client.disconnect(); } },
        );
        frame.write(`node-${i}`);
        frame.end();
      }
    } else if (mode === 'consume') {
      let seen = 0;
      client.subscribe({ destination, ack: 'client-individual' }, (e, message) => {
        if (e) return fail('subscribe', e);
        message.readString('utf-8', (e2, body) => {
          if (e2) return fail('read', e2);
          console.log(JSON.stringify({ body, headers: message.headers }));
          client.ack(message);
          if (++seen === count) client.disconnect();
        });
      });
    } else {
      fail('usage', `unknown mode ${mode}`);
    }
  },
);
