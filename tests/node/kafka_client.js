// A Kafka client from npm (kafkajs) that the test suite drives against sparkmq's Kafka listener.
//   node kafka_client.js produce <port> <topic> <count>        keys k<i%3>, a header, values kjs-<i>
//   node kafka_client.js consume <port> <topic> <group> <count> prints "offset key value" lines
//   node kafka_client.js transact <port> <topic> <group>        a committed transaction (tx-0..2,
//        and offset 3 of <topic> for <group>), an aborted one (gone), a committed one (tx-3)
const { Kafka, logLevel } = require('kafkajs');

const [mode, port, topic, ...rest] = process.argv.slice(2);
const kafka = new Kafka({ clientId: 'kafkajs-test', brokers: [`127.0.0.1:${port}`], logLevel: logLevel.ERROR });

async function produce(count) {
  const producer = kafka.producer({ allowAutoTopicCreation: true });
  await producer.connect();
  const messages = [];
  for (let i = 0; i < count; i++) {
    messages.push({ key: `k${i % 3}`, value: `kjs-${i}`, headers: { from: 'kafkajs' } });
  }
  const answers = await producer.send({ topic, acks: -1, messages });
  console.log(JSON.stringify(answers));
  await producer.disconnect();
}

async function consume(group, count) {
  const consumer = kafka.consumer({ groupId: group, sessionTimeout: 10000, heartbeatInterval: 500 });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  let seen = 0;
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`only ${seen} of ${count} within 60 s`)), 60000);
    consumer.run({
      eachMessage: async ({ message }) => {
        console.log(`${message.offset} ${message.key} ${message.value} ${message.headers.from || ''}`);
        seen += 1;
        if (seen >= count) { clearTimeout(timer); resolve(); }
      },
    }).catch(reject);
  });
  await consumer.commitOffsets([]).catch(() => {});
  await consumer.disconnect();
}

async function transact(group) {
  const producer = kafka.producer({
    transactionalId: `kjs-${topic}`, idempotent: true, maxInFlightRequests: 1,
    allowAutoTopicCreation: true,
  });
  await producer.connect();
  const first = await producer.transaction();
  await first.send({ topic, messages: [0, 1, 2].map((i) => ({ value: `tx-${i}` })) });
  await first.sendOffsets({
    consumerGroupId: group,
    topics: [{ topic, partitions: [{ partition: 0, offset: '3' }] }],
  });
  await first.commit();
  const second = await producer.transaction();
  await second.send({ topic, messages: [{ value: 'gone' }] });
  await second.abort();
  const third = await producer.transaction();
  await third.send({ topic, messages: [{ value: 'tx-3' }] });
  await third.commit();
  await producer.disconnect();
  console.log('done');
}

(async () => {
  if (mode === 'produce') await produce(Number(rest[0]));
  else if (mode === 'transact') await transact(rest[0]);
  else if (mode === 'consume') await consume(rest[0], Number(rest[1]));
  else throw new Error(`unknown mode ${mode}`);
})().catch((err) => { console.error(err.stack || String(err)); process.exit(1); });
