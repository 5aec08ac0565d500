// sarama (Go; Debian's golang-github-shopify-sarama-dev) behind the command line every Kafka
// driver of the suite has (tests/kafka_drivers/python_driver.py says what each command does):
//
//	sarama_driver produce BOOTSTRAP TOPIC COUNT PREFIX
//	sarama_driver consume BOOTSTRAP TOPIC GROUP COUNT
//	sarama_driver member BOOTSTRAP TOPIC GROUP
//
// KAFKA_USER/KAFKA_PASSWORD: SASL/PLAIN; KAFKA_CA: TLS. A Kafka error prints "error CODE NAME"
// and exits 3. Built by the suite with Debian's Go, offline (GOPATH mode, Debian's sources).
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io/ioutil"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/Shopify/sarama"
)

func failed(err error) {
	code := "none"
	if k, ok := err.(sarama.KError); ok {
		code = strconv.Itoa(int(k))
	}
	if pe, ok := err.(sarama.ProducerErrors); ok && len(pe) > 0 {
		if k, ok := pe[0].Err.(sarama.KError); ok {
			code = strconv.Itoa(int(k))
		}
	}
	fmt.Printf("error %s %T: %v\n", code, err, err)
	os.Exit(3)
}

func config() *sarama.Config {
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_0_0_0 // record batches, the group protocol
	cfg.ClientID = "sarama-driver"
	cfg.Metadata.Retry.Max = 2
	if ca := os.Getenv("KAFKA_CA"); ca != "" {
		pem, err := ioutil.ReadFile(ca)
		if err != nil {
			failed(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		cfg.Net.TLS.Enable = true
		cfg.Net.TLS.Config = &tls.Config{RootCAs: pool}
	}
	if user := os.Getenv("KAFKA_USER"); user != "" {
		cfg.Net.SASL.Enable = true
		cfg.Net.SASL.Mechanism = sarama.SASLTypePlaintext
		cfg.Net.SASL.User = user
		cfg.Net.SASL.Password = os.Getenv("KAFKA_PASSWORD")
	}
	return cfg
}

func produce(bootstrap, topic string, count int, prefix string) {
	cfg := config()
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Successes = true
	cfg.Producer.Retry.Max = 2
	p, err := sarama.NewSyncProducer([]string{bootstrap}, cfg)
	if err != nil {
		failed(err)
	}
	msgs := make([]*sarama.ProducerMessage, count)
	for i := range msgs {
		msgs[i] = &sarama.ProducerMessage{Topic: topic, Value: sarama.StringEncoder(fmt.Sprintf("%s-%d", prefix, i))}
	}
	if err := p.SendMessages(msgs); err != nil {
		failed(err)
	}
	if err := p.Close(); err != nil {
		failed(err)
	}
	fmt.Printf("produced %d\n", count)
}

type handler struct {
	want   int // 0: until stopped
	seen   int
	member bool
	done   chan struct{}
}

func (h *handler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *handler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h *handler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	for m := range c.Messages() {
		if h.want > 0 && h.seen >= h.want {
			return nil
		}
		s.MarkMessage(m, "")
		h.seen++
		if h.member {
			fmt.Printf("got %s\n", m.Value)
		} else {
			fmt.Printf("%s\n", m.Value)
		}
		if h.want > 0 && h.seen >= h.want {
			close(h.done)
			return nil
		}
	}
	return nil
}

func consume(bootstrap, topic, group string, want int, member bool) {
	cfg := config()
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Offsets.CommitInterval = 100 * time.Millisecond
	// a retention makes this sarama send OffsetCommit v2: v0 and v1 are gone from Kafka 4
	// (KIP-896) and from sparkmq, as from every broker of today
	cfg.Consumer.Offsets.Retention = 24 * time.Hour
	cfg.Consumer.Group.Session.Timeout = 10 * time.Second
	cfg.Consumer.Group.Heartbeat.Interval = 500 * time.Millisecond
	cfg.Consumer.Return.Errors = true
	g, err := sarama.NewConsumerGroup([]string{bootstrap}, group, cfg)
	if err != nil {
		failed(err)
	}
	h := &handler{want: want, member: member, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	errs := make(chan error, 1)
	go func() {
		for ctx.Err() == nil {
			if err := g.Consume(ctx, []string{topic}, h); err != nil {
				errs <- err
				return
			}
		}
	}()
	go func() {
		for err := range g.Errors() {
			errs <- err
		}
	}()
	select {
	case <-h.done:
	case <-stop:
	case err := <-errs:
		failed(err)
	}
	cancel()
	if err := g.Close(); err != nil { // (commits what was marked, leaves the group)
		failed(err)
	}
}

func main() {
	a := os.Args[1:]
	switch a[0] {
	case "produce":
		n, _ := strconv.Atoi(a[3])
		produce(a[1], a[2], n, a[4])
	case "consume":
		n, _ := strconv.Atoi(a[4])
		consume(a[1], a[2], a[3], n, false)
	case "member":
		consume(a[1], a[2], a[3], 0, true)
	default:
		fmt.Fprintf(os.Stderr, "unknown mode %s\n", a[0])
		os.Exit(2)
	}
}
