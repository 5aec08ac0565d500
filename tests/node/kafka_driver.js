// kafkajs (npm) behind the command line every Kafka driver of the suite has
// (tests/kafka_drivers/python_driver.py says what each command does):
//   node kafka_driver.js produce BOOTSTRAP TOPIC COUNT PREFIX
//   node kafka_driver.js consume BOOTSTRAP TOPIC GROUP COUNT
//   node kafka_driver.js member BOOTSTRAP TOPIC GROUP
// KAFKA_USER/KAFKA_PASSWORD: SASL/PLAIN; KAFKA_CA: TLS. A Kafka error prints "error CODE NAME"
// and exits 3.
const fs = require('fs');
const { Kafka, logLevel } = require('kafkajs');

const [mode, bootstrap, topic, ...rest] = process.argv.slice(2);
const config = { clientId: 'kafkajs-driver', brokers: [bootstrap], logLevel: logLevel.NOTHING };
if (process.env.KAFKA_CA) config.ssl = { ca: [fs.readFileSync(process.env.KAFKA_CA, 'utf-8')] };
if (process.env.KAFKA_USER) {
  config.sasl = { mechanism: 'plain', username: process.env.KAFKA_USER, password: process.env.KAFKA_PASSWORD || '' };
}
const kafka = new Kafka(config);

function failed(err) {
  // the Kafka error under kafkajs' wrappers (a retriable error's cause, a batch's errors)
  let e = err;
  for (let i = 0; i < 10 && e && e.code === undefined; i++) {
    e = e.originalError || e.cause || (e.errors && e.errors[0]) || null;
  }
  const code = e && e.code !== undefined ? e.code : 'none';
  console.log(`error ${code} ${(e && e.type) || err.name}: ${err.message}`);
  process.exit(3);
}

async function produce(count, prefix) {
  const producer = kafka.producer({ allowAutoTopicCreation: true, retry: { retries: 2 } });
  await producer.connect();
  const messages = [];
  for (let i = 0; i < count; i++) messages.push({ value: `${prefix}-${i}` });
  await producer.send({ topic, acks: -1, messages });
  await producer.disconnect();
  console.log(`produced ${count}`);
}

async function consume(group, count) {
  const consumer = kafka.consumer({ groupId: group, sessionTimeout: 10000, heartbeatInterval: 500, maxWaitTimeInMs: 500, retry: { retries: 2 } });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  let seen = 0;
  let stopping = false;
  const finished = new Promise((resolve, reject) => {
    if (count === null) {
      process.on('SIGTERM', () => { stopping = true; resolve(); });
    }
    consumer.on(consumer.events.CRASH, ({ payload }) => reject(payload.error));
    consumer.run({
      autoCommit: false,
      partitionsConsumedConcurrently: 1,
      eachMessage: async ({ topic: t, partition, message }) => {
        if (stopping) return;
        await consumer.commitOffsets([{ topic: t, partition, offset: String(Number(message.offset) + 1) }]);
        seen += 1;
        console.log(count === null ? `got ${message.value}` : `${message.value}`);
        if (count !== null && seen >= count) { stopping = true; resolve(); }
      },
    }).catch(reject);
  });
  await finished;
  await consumer.disconnect();
}

(async () => {
  if (mode === 'produce') await produce(Number(rest[0]), rest[1]);
  else if (mode === 'consume') await consume(rest[0], Number(rest[1]));
  else if (mode === 'member') await consume(rest[0], null);
  else throw new Error(`unknown mode ${mode}`);
})().catch(failed);
