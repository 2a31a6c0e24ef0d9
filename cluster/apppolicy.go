package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/kjob/kjob/actors/kerr"
	"github.com/kjob/kjob/actors/route"
	shardcore "github.com/kjob/kjob/actors/shard/core"
	"github.com/kjob/kjob/messages"
)

// LoadAppPolicies reads per-app default policies from a JSON file: an object
// whose keys are app names and whose values are policies in protobuf's JSON form,
// for example
//
//	{
//	  "billing": {"attempts": 3, "ladderMs": ["2000", "60000"], "timeoutMs": "30000"},
//	  "reports": {"misfire": "SKIP", "concurrency": "FORBID", "route": "LEAST_BUSY"}
//	}
//
// (64-bit numbers may be written as strings or numbers). Each policy is checked
// as a job's would be; an error names the file, the app and the field.
func LoadAppPolicies(path string) (map[string]*messages.Policy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("%s: an object of app name → policy is expected: %w", path, err)
	}
	out := make(map[string]*messages.Policy, len(raw))
	for app, r := range raw {
		p := &messages.Policy{}
		if err := protojson.Unmarshal(r, p); err != nil {
			return nil, fmt.Errorf("%s: app %q: %w", path, app, err)
		}
		out[app] = p
	}
	if err := checkAppPolicies(out); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// checkAppPolicies validates every app's default policy (in app order, so the
// error is the same each time).
func checkAppPolicies(m map[string]*messages.Policy) error {
	apps := make([]string, 0, len(m))
	for app := range m {
		apps = append(apps, app)
	}
	sort.Strings(apps)
	for _, app := range apps {
		if why := route.ValidApp(app); why != "" {
			return kerr.FromWire(kerr.Invalid("app", "app policies: %q: %s", app, why))
		}
		if e := shardcore.ValidatePolicy(m[app], ""); e != nil {
			e.Message = fmt.Sprintf("app policies: %q: %s", app, e.Message)
			return kerr.FromWire(e)
		}
	}
	return nil
}
