// Command validate checks deploy/ offline, without a cluster, an Envoy binary or istioctl:
//
//   - every Kubernetes object that `kubectl kustomize` renders from deploy/kubernetes,
//     deploy/kubernetes/migrate and deploy/envoy (and secret.example.yaml) decodes strictly
//     into its k8s.io/api type: an unknown or misspelt field, or a wrong type, is an error;
//   - the Istio resources of deploy/envoy/istio.yaml decode strictly into istio.io/api;
//   - deploy/envoy/envoy.yaml decodes into Envoy's Bootstrap (go-control-plane), every typed
//     extension config included, and passes the API's validation rules (protoc-gen-validate);
//   - the Lua filter of envoy.yaml turns a list of roles into one comma-separated header;
//   - the rules deploy/README.md relies on: probes, drain budget, indexing threads, non-root
//     read-only containers, appProtocol, header stripping before JWT verification.
//
// Run from this directory: go run . (needs kubectl on PATH for its kustomize).
package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	jwtv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	luav3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	lua "github.com/yuin/gopher-lua"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	securityv1beta1 "istio.io/api/security/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

var failures []string

func fail(format string, args ...any) {
	failures = append(failures, fmt.Sprintf(format, args...))
}

func main() {
	deploy := ".."
	var objects []any
	for _, dir := range []string{"kubernetes", "kubernetes/migrate", "envoy"} {
		out, err := exec.Command("kubectl", "kustomize", filepath.Join(deploy, dir)).Output()
		if err != nil {
			fail("kubectl kustomize %s: %v", dir, err)
			continue
		}
		objs := decodeKube(dir, out)
		fmt.Printf("%-22s %d objects rendered and decoded strictly\n", dir, len(objs))
		objects = append(objects, objs...)
	}
	secrets := decodeKube("secret.example.yaml", read(filepath.Join(deploy, "kubernetes/secret.example.yaml")))
	fmt.Printf("%-22s %d objects decoded strictly\n", "secret.example.yaml", len(secrets))
	checkIstio(read(filepath.Join(deploy, "envoy/istio.yaml")))
	checkEnvoy(read(filepath.Join(deploy, "envoy/envoy.yaml")))
	checkRules(objects)
	if len(failures) > 0 {
		for _, f := range failures {
			fmt.Println("FAIL:", f)
		}
		os.Exit(1)
	}
	fmt.Println("deploy/: all checks passed")
}

func read(path string) []byte {
	data, err := os.ReadFile(path)
	if err != nil {
		fail("%v", err)
	}
	return data
}

// documents splits a multi-document YAML stream.
func documents(data []byte) [][]byte {
	var docs [][]byte
	for _, part := range bytes.Split(data, []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(part))) > 0 {
			docs = append(docs, part)
		}
	}
	return docs
}

func stripComments(doc []byte) []byte {
	var out [][]byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

var kubeTypes = map[string]func() any{
	"v1/Namespace":                           func() any { return &corev1.Namespace{} },
	"v1/ServiceAccount":                      func() any { return &corev1.ServiceAccount{} },
	"v1/ConfigMap":                           func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                              func() any { return &corev1.Secret{} },
	"v1/Service":                             func() any { return &corev1.Service{} },
	"apps/v1/Deployment":                     func() any { return &appsv1.Deployment{} },
	"batch/v1/Job":                           func() any { return &batchv1.Job{} },
	"policy/v1/PodDisruptionBudget":          func() any { return &policyv1.PodDisruptionBudget{} },
	"autoscaling/v2/HorizontalPodAutoscaler": func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"networking.k8s.io/v1/NetworkPolicy":     func() any { return &networkingv1.NetworkPolicy{} },
}

func decodeKube(source string, data []byte) []any {
	var objs []any
	for _, doc := range documents(data) {
		var head metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &head); err != nil {
			fail("%s: %v", source, err)
			continue
		}
		newObj, ok := kubeTypes[head.APIVersion+"/"+head.Kind]
		if !ok {
			fail("%s: no type known for %s/%s", source, head.APIVersion, head.Kind)
			continue
		}
		obj := newObj()
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			fail("%s: %s: %v", source, head.Kind, err)
			continue
		}
		objs = append(objs, obj)
	}
	return objs
}

// checkIstio decodes each resource's metadata into ObjectMeta and its spec into the
// istio.io/api message (security.istio.io/v1 serves the v1beta1 messages), rejecting
// unknown fields.
func checkIstio(data []byte) {
	specs := map[string]func() proto.Message{
		"PeerAuthentication":    func() proto.Message { return &securityv1beta1.PeerAuthentication{} },
		"RequestAuthentication": func() proto.Message { return &securityv1beta1.RequestAuthentication{} },
		"AuthorizationPolicy":   func() proto.Message { return &securityv1beta1.AuthorizationPolicy{} },
	}
	count := 0
	for _, doc := range documents(data) {
		var obj struct {
			APIVersion string            `json:"apiVersion"`
			Kind       string            `json:"kind"`
			Metadata   metav1.ObjectMeta `json:"metadata"`
			Spec       any               `json:"spec"`
		}
		if err := yaml.UnmarshalStrict(doc, &obj); err != nil {
			fail("istio.yaml: %v", err)
			continue
		}
		newSpec, ok := specs[obj.Kind]
		if !ok || obj.APIVersion != "security.istio.io/v1" {
			fail("istio.yaml: unexpected %s %s", obj.APIVersion, obj.Kind)
			continue
		}
		spec, _ := yaml.Marshal(obj.Spec)
		specJSON, _ := yaml.YAMLToJSON(spec)
		if err := protojson.Unmarshal(specJSON, newSpec()); err != nil {
			fail("istio.yaml: %s %s: %v", obj.Kind, obj.Metadata.Name, err)
			continue
		}
		count++
	}
	fmt.Printf("%-22s %d Istio resources decoded strictly (istio.io/api)\n", "envoy/istio.yaml", count)
}

func checkEnvoy(data []byte) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		fail("envoy.yaml: %v", err)
		return
	}
	var bootstrap bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &bootstrap); err != nil {
		fail("envoy.yaml: %v", err)
		return
	}
	configs := 0
	if err := validateTree(bootstrap.ProtoReflect(), true, &configs); err != nil {
		fail("envoy.yaml: %v", err)
		return
	}
	fmt.Printf("%-22s Bootstrap and %d typed configs decoded and validated (Envoy API v1.40)\n",
		"envoy/envoy.yaml", configs)

	// The trust boundary: x-memoria-* stripped before jwt_authn, which sets all three.
	var hcm hcmv3.HttpConnectionManager
	filters := bootstrap.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()
	if err := filters[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		fail("envoy.yaml: first network filter: %v", err)
		return
	}
	var order []string
	var script string
	for _, f := range hcm.GetHttpFilters() {
		order = append(order, f.GetName())
		switch f.GetName() {
		case "envoy.filters.http.jwt_authn":
			var jwt jwtv3.JwtAuthentication
			_ = f.GetTypedConfig().UnmarshalTo(&jwt)
			headers := map[string]bool{}
			for _, p := range jwt.GetProviders() {
				for _, c := range p.GetClaimToHeaders() {
					headers[c.GetHeaderName()] = true
				}
				if p.GetForward() {
					fail("envoy.yaml: the token should not be forwarded in trusted-headers mode")
				}
			}
			for _, h := range []string{"x-memoria-tenant", "x-memoria-principal", "x-memoria-roles"} {
				if !headers[h] {
					fail("envoy.yaml: no claim_to_headers sets %s", h)
				}
			}
		case "envoy.filters.http.lua":
			var l luav3.Lua
			_ = f.GetTypedConfig().UnmarshalTo(&l)
			script = l.GetDefaultSourceCode().GetInlineString()
		}
	}
	want := "envoy.filters.http.header_mutation,envoy.filters.http.jwt_authn,envoy.filters.http.lua,envoy.filters.http.router"
	if strings.Join(order, ",") != want {
		fail("envoy.yaml: HTTP filters are %v, want %s", order, want)
	}
	checkLua(script)
}

// validateTree runs the API's validation rules on a message and, since those stop at
// google.protobuf.Any, on every typed config inside it.
func validateTree(m protoreflect.Message, root bool, configs *int) error {
	if root {
		if v, ok := m.Interface().(interface{ ValidateAll() error }); ok {
			if err := v.ValidateAll(); err != nil {
				return fmt.Errorf("%s: %w", m.Descriptor().FullName(), err)
			}
		}
	}
	var err error
	visit := func(sub protoreflect.Message) {
		if err != nil {
			return
		}
		if a, ok := sub.Interface().(*anypb.Any); ok {
			inner, e := a.UnmarshalNew()
			if e != nil {
				err = fmt.Errorf("%s: %w", a.GetTypeUrl(), e)
				return
			}
			*configs++
			err = validateTree(inner.ProtoReflect(), true, configs)
			return
		}
		err = validateTree(sub, false, configs)
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := 0; i < v.List().Len(); i++ {
				visit(v.List().Get(i).Message())
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				visit(mv.Message())
				return true
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			visit(v.Message())
		}
		return err == nil
	})
	return err
}

// checkLua runs the filter's envoy_on_request against a stand-in request handle (Envoy runs
// LuaJIT, whose syntax is Lua 5.1's, like gopher-lua's).
func checkLua(script string) {
	cases := []struct {
		name    string
		payload string // a Lua expression for meta["jwt_payload"], or "" for no metadata
		want    string // x-memoria-roles afterwards; "<unset>" if never replaced
	}{
		{"list of roles", `{roles = {"memoria-admin", "reader"}}`, "memoria-admin,reader"},
		{"string roles (left to claim_to_headers)", `{roles = "memoria-admin"}`, "<unset>"},
		{"no roles claim", `{sub = "p"}`, "<unset>"},
		{"no jwt metadata", ``, "<unset>"},
		{"empty list", `{roles = {}}`, ""},
	}
	for _, c := range cases {
		L := lua.NewState()
		meta := "nil"
		if c.payload != "" {
			meta = "{jwt_payload = " + c.payload + "}"
		}
		harness := `
			replaced = "<unset>"
			local headers = {}
			function headers:replace(k, v) if k == "x-memoria-roles" then replaced = v end end
			local dm = {}
			function dm:get(ns) if ns == "envoy.filters.http.jwt_authn" then return ` + meta + ` end end
			local si = {}
			function si:dynamicMetadata() return dm end
			handle = {}
			function handle:streamInfo() return si end
			function handle:headers() return headers end
		`
		if err := L.DoString(script + "\n" + harness + "\nenvoy_on_request(handle)"); err != nil {
			fail("envoy.yaml Lua (%s): %v", c.name, err)
		} else if got := L.GetGlobal("replaced").String(); got != c.want {
			fail("envoy.yaml Lua (%s): x-memoria-roles = %q, want %q", c.name, got, c.want)
		}
		L.Close()
	}
	fmt.Printf("%-22s Lua roles filter: %d cases pass\n", "envoy/envoy.yaml", len(cases))
}

// checkRules checks what deploy/README.md promises about the rendered objects.
func checkRules(objects []any) {
	config := map[string]string{}
	deployments := map[string]*appsv1.Deployment{}
	for _, o := range objects {
		switch obj := o.(type) {
		case *corev1.ConfigMap:
			if obj.Name == "memoria-config" {
				config = obj.Data
			}
		case *appsv1.Deployment:
			deployments[obj.Name] = obj
			checkPod(obj.Name, obj.Spec.Template.Spec)
		case *batchv1.Job:
			checkPod(obj.Name, obj.Spec.Template.Spec)
		case *corev1.Service:
			if obj.Labels["app.kubernetes.io/name"] == "memoria" {
				for _, p := range obj.Spec.Ports {
					if p.AppProtocol == nil || *p.AppProtocol != "grpc" {
						fail("Service %s port %s: appProtocol should be grpc", obj.Name, p.Name)
					}
				}
			}
		}
	}
	server, worker := deployments["memoria-server"], deployments["memoria-worker"]
	if server == nil || worker == nil {
		fail("memoria-server and memoria-worker Deployments expected")
		return
	}
	c := server.Spec.Template.Spec.Containers[0]
	port := c.Ports[0].ContainerPort
	for name, probe := range map[string]*corev1.Probe{
		"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe, "startup": c.StartupProbe,
	} {
		if probe == nil || probe.GRPC == nil || probe.GRPC.Port != port {
			fail("memoria-server: %s probe should be gRPC on port %d", name, port)
		}
	}
	// Readiness: a service that PostgreSQL outages and SIGTERM flip. "" also flips on a
	// Qdrant outage (every pod at once); MemoryBlockService does not (deploy/README.md).
	if s := c.ReadinessProbe.GRPC.Service; s == nil || (*s != "" && *s != "memoria.v1.MemoryBlockService") {
		fail("memoria-server: readiness should ask about memoria.v1.MemoryBlockService or \"\"")
	}
	if s := c.LivenessProbe.GRPC.Service; s == nil || *s == "" || strings.HasPrefix(*s, "memoria.") {
		fail("memoria-server: liveness must not ask about a service that a store outage flips")
	}
	grace, err := strconv.ParseFloat(config["MEMORIA_SHUTDOWN_GRACE_SECONDS"], 64)
	if err != nil {
		fail("memoria-config: MEMORIA_SHUTDOWN_GRACE_SECONDS: %v", err)
	}
	pause := int64(0)
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		pause = c.Lifecycle.PreStop.Sleep.Seconds
	} else {
		fail("memoria-server: a preStop pause is expected")
	}
	budget := *server.Spec.Template.Spec.TerminationGracePeriodSeconds
	if float64(budget) < float64(pause)+grace+5 {
		fail("memoria-server: terminationGracePeriodSeconds %d < preStop %d + drain %.0f + 5", budget, pause, grace)
	}
	if env(c, "MEMORIA_INDEX_WORKER_THREADS") != "0" {
		fail("memoria-server: MEMORIA_INDEX_WORKER_THREADS should be 0 (memoria-worker indexes)")
	}
	if config["MEMORIA_AUTH"] != "trusted-headers" {
		fail("memoria-config: MEMORIA_AUTH should be set explicitly")
	}
	fmt.Printf("%-22s probes, drain budget (%ds >= %ds + %.0fs + 5s), indexing threads, security contexts, appProtocol: ok\n",
		"rules", budget, pause, grace)
}

func env(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func checkPod(name string, pod corev1.PodSpec) {
	for _, c := range pod.Containers {
		sc := c.SecurityContext
		nonRoot := (pod.SecurityContext != nil && pod.SecurityContext.RunAsNonRoot != nil && *pod.SecurityContext.RunAsNonRoot) ||
			(sc != nil && sc.RunAsNonRoot != nil && *sc.RunAsNonRoot)
		if !nonRoot {
			fail("%s/%s: runAsNonRoot expected", name, c.Name)
		}
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			fail("%s/%s: readOnlyRootFilesystem expected", name, c.Name)
		}
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			fail("%s/%s: allowPrivilegeEscalation: false expected", name, c.Name)
		}
		if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			fail("%s/%s: memory request and limit expected", name, c.Name)
		}
	}
}
