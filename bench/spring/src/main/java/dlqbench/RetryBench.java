package dlqbench;

import java.math.BigInteger;
import java.nio.charset.StandardCharsets;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.common.header.Header;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.kafka.annotation.BackOff;
import org.springframework.kafka.annotation.KafkaListener;
import org.springframework.kafka.annotation.RetryableTopic;
import org.springframework.kafka.retrytopic.DltStrategy;
import org.springframework.kafka.retrytopic.RetryTopicHeaders;
import org.springframework.kafka.retrytopic.TopicSuffixingStrategy;

/**
 * The comparison system of dlqapp's `spring` bench section: Spring Kafka's {@code @RetryableTopic}
 * with delays of 1, 2 and 4 s (four attempts), a call of {@code bench.latency-ms} per attempt, and a
 * request that fails as many times as its body's {@code fail_times} says.
 *
 * <p>Prints one line per attempt on standard output, which the bench reads:
 * {@code BENCH <key> <retry> <lateness ms>}, where retry 0 is the first attempt (lateness 0) and
 * the lateness of a retry is its start minus the due time Spring wrote into the record
 * ({@code retry_topic-backoff-timestamp}).
 */
@SpringBootApplication
public class RetryBench {

    @Value("${bench.latency-ms:100}")
    private long latencyMs;

    public static void main(String[] args) {
        SpringApplication.run(RetryBench.class, args);
    }

    @RetryableTopic(
            attempts = "4",
            backOff = @BackOff(delay = 1000, multiplier = 2.0),
            numPartitions = "${bench.partitions}",
            replicationFactor = "1",
            topicSuffixingStrategy = TopicSuffixingStrategy.SUFFIX_WITH_INDEX_VALUE,
            dltStrategy = DltStrategy.NO_DLT,
            concurrency = "${bench.partitions}")
    @KafkaListener(topics = "${bench.input}", groupId = "${bench.group}", concurrency = "${bench.partitions}")
    public void attempt(ConsumerRecord<String, String> record) throws InterruptedException {
        long started = System.currentTimeMillis();
        Header due = record.headers().lastHeader(RetryTopicHeaders.DEFAULT_HEADER_BACKOFF_TIMESTAMP);
        int retry = retryOf(record.topic());
        long lateness = due == null ? 0 : started - new BigInteger(due.value()).longValue();
        System.out.println("BENCH " + record.key() + " " + retry + " " + lateness);
        Thread.sleep(latencyMs);
        if (retry < failTimes(record.value())) {
            throw new IllegalStateException("planned failure " + (retry + 1));
        }
    }

    /** 0 on the input topic, i + 1 on its retry topic {@code -retry-i}. */
    static int retryOf(String topic) {
        int at = topic.lastIndexOf("-retry-");
        return at < 0 ? 0 : Integer.parseInt(topic.substring(at + "-retry-".length())) + 1;
    }

    /** The request's planned failures: the number after {@code "fail_times":} in its JSON body, else 0. */
    static int failTimes(String body) {
        int at = body == null ? -1 : body.indexOf("\"fail_times\":");
        if (at < 0) {
            return 0;
        }
        String rest = body.substring(at + "\"fail_times\":".length()).trim();
        int end = 0;
        while (end < rest.length() && Character.isDigit(rest.charAt(end))) {
            end++;
        }
        return end == 0 ? 0 : Integer.parseInt(rest.substring(0, end));
    }
}
