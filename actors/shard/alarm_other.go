//go:build !linux

package shard

import "errors"

func newAlarmBackend() (alarmBackend, error) {
	return nil, errors.New("no precise timer on this platform")
}
