package cli

import (
	"strings"

	"github.com/tenure-dev/tenure/consumer"
)

// The checks every command applies to the names it is given, before it
// connects to anything: Kafka's rules for topics (consumer.ValidateTopic),
// valid UTF-8 without control characters for groups and worker names. A bad
// name is a usage error (exit 2).

// validTopic checks the one topic given with --flagName.
func validTopic(flagName, topic string) error {
	if strings.Contains(topic, ",") {
		return usagef("--%s takes one topic, got %q", flagName, topic)
	}
	if err := consumer.ValidateTopic(topic); err != nil {
		return usagef("--%s: %v", flagName, err)
	}
	return nil
}

// validTopics checks the comma-separated topics given with --flagName.
func validTopics(flagName string, topics []string) error {
	for _, t := range topics {
		if err := consumer.ValidateTopic(t); err != nil {
			return usagef("--%s: %v", flagName, err)
		}
	}
	return nil
}

// validGroup checks the consumer group given with --flagName.
func validGroup(flagName, group string) error {
	if err := consumer.ValidateGroup(group); err != nil {
		return usagef("--%s: %v", flagName, err)
	}
	return nil
}

// optional applies check to a filter flag only when it is set.
func optional(value string, check func() error) error {
	if value == "" {
		return nil
	}
	return check()
}
