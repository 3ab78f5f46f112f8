package consumer

import (
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/zap"
)

// kzap routes kgo's logs into zap. kgo's info level is chatty about normal
// group life, so it is logged at debug; warnings and errors keep their level.
type kzap struct{ l *zap.Logger }

func (k kzap) Level() kgo.LogLevel {
	switch {
	case k.l.Core().Enabled(zap.DebugLevel):
		return kgo.LogLevelInfo
	case k.l.Core().Enabled(zap.WarnLevel):
		return kgo.LogLevelWarn
	}
	return kgo.LogLevelError
}

func (k kzap) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	fields := make([]zap.Field, 0, len(keyvals)/2)
	for i := 0; i+1 < len(keyvals); i += 2 {
		key, _ := keyvals[i].(string)
		fields = append(fields, zap.Any(key, keyvals[i+1]))
	}
	switch level {
	case kgo.LogLevelError:
		k.l.Error(msg, fields...)
	case kgo.LogLevelWarn:
		k.l.Warn(msg, fields...)
	default:
		k.l.Debug(msg, fields...)
	}
}
