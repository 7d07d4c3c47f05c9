{{/* Helpers of the DRA drivers' objects (dra-*.yaml). A DRA driver talks to the API server
(claims, slices, its Node), so unlike the device plugins its pods mount a service-account
token. (dict "root" $ "component" "nvidia"|"generic") throughout. */}}

{{/* Name of a DRA driver's objects: <fullname>-dra-<component>. */}}
{{- define "kubedevice.draName" -}}
{{- printf "%s-dra-%s" (include "kubedevice.fullname" .root) .component -}}
{{- end -}}

{{/* Labels of a DRA driver's objects; the component label is dra-<component>. */}}
{{- define "kubedevice.draCtx" -}}
{{- dict "root" .root "component" (printf "dra-%s" .component) | toJson -}}
{{- end -}}

{{/* The pod spec fields of a DRA driver (scheduling from dra.<component>). */}}
{{- define "kubedevice.draPodCommon" -}}
{{- $v := .root.Values -}}
{{- $c := index $v.dra .component -}}
serviceAccountName: {{ include "kubedevice.draName" . }}
automountServiceAccountToken: true
terminationGracePeriodSeconds: {{ $v.dra.terminationGracePeriodSeconds }}
enableServiceLinks: false
{{- with $v.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $v.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- $sched := pick $c "nodeSelector" "affinity" "tolerations" }}
{{- if and (eq .component "nvidia") (not $c.affinity) }}
{{- /* The GPU nodes the GPU plugin selects (nvidia.affinity): one definition for both. */}}
{{- $_ := set $sched "affinity" $v.nvidia.affinity }}
{{- end }}
{{- include "kubedevice.scheduling" $sched }}
{{- end -}}

{{/* The env every DRA driver gets: its node's name and its pod's UID (its sockets are named
by it, so that two pods run side by side while the DaemonSet rolls) from the downward API,
how long a SIGTERM waits for the calls in flight (2 s under the pod's grace period, for
the rest of the stop), and logging. */}}
{{- define "kubedevice.draEnv" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: POD_UID
  valueFrom:
    fieldRef:
      fieldPath: metadata.uid
- name: KUBEDEVICE_STOP_GRACE
  value: {{ max 0 (sub (int .root.Values.dra.terminationGracePeriodSeconds) 2) | quote }}
{{ include "kubedevice.logEnv" .root }}
{{- end -}}

{{/* A path under the kubelet's directory (dra.kubeletDir), quoted: (dict "root" $ "sub" name). */}}
{{- define "kubedevice.draKubeletPath" -}}
{{- printf "%s/%s" (trimSuffix "/" .root.Values.dra.kubeletDir) .sub | quote -}}
{{- end -}}

{{/* The kubelet's DRA plugin directories (mounted where the kubelet has them: it dials the
driver's socket by its host path), the CDI dir and the host's /dev and /sys. */}}
{{- define "kubedevice.draMounts" -}}
- name: plugins-registry
  mountPath: {{ include "kubedevice.draKubeletPath" (dict "root" .root "sub" "plugins_registry") }}
- name: plugins
  mountPath: {{ include "kubedevice.draKubeletPath" (dict "root" .root "sub" "plugins") }}
- name: cdi
  mountPath: /var/run/cdi
- name: host-dev
  mountPath: /host/dev
  readOnly: true
  mountPropagation: HostToContainer
- name: host-sys
  mountPath: /host/sys
  readOnly: true
{{- end -}}

{{- define "kubedevice.draVolumes" -}}
- name: plugins-registry
  hostPath:
    path: {{ include "kubedevice.draKubeletPath" (dict "root" .root "sub" "plugins_registry") }}
    type: Directory
- name: plugins
  hostPath:
    path: {{ include "kubedevice.draKubeletPath" (dict "root" .root "sub" "plugins") }}
    type: DirectoryOrCreate
- name: cdi
  hostPath:
    path: {{ .root.Values.dra.cdiDir | quote }}
    type: DirectoryOrCreate
- name: host-dev
  hostPath:
    path: "/dev"
    type: Directory
- name: host-sys
  hostPath:
    path: "/sys"
    type: Directory
{{- end -}}

{{/* The arguments every DRA driver takes. */}}
{{- define "kubedevice.draArgs" -}}
- --driver-name
- {{ (index .root.Values.dra .component).driverName | quote }}
- --kubelet-dir
- {{ .root.Values.dra.kubeletDir | quote }}
- --cdi-dir
- /var/run/cdi
- --dev-root
- /host/dev
- --sys-root
- /host/sys
- --metrics-address
- "0.0.0.0:{{ (index .root.Values.dra .component).metricsPort }}"
{{- range (index .root.Values.dra .component).evictOn }}
- --evict-on
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* A DRA driver's port (/metrics, /healthz, /readyz) and its probes: started once the DRA
socket is served (the first device list is in), live while it is and no job of the driver
has failed, ready once the kubelet has registered the driver, its ResourceSlices are
published and its API calls are not failing (so a rollout stops at a new pod that cannot
reach the API server). No shell needed. */}}
{{- define "kubedevice.draProbes" -}}
ports:
  - name: metrics
    containerPort: {{ (index .root.Values.dra .component).metricsPort }}
    protocol: TCP
startupProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: 2
  failureThreshold: 60
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  periodSeconds: 5
  timeoutSeconds: 5
{{- end -}}

{{/* The DeviceClass name of an extended resource, as kubedevice.dra.api.classes.class_name makes
it: "/" -> "-"; when that is not a DNS subdomain as it stands, lower-cased, other characters
"-", and the first 8 hex digits of the resource name's SHA-1 appended. */}}
{{- define "kubedevice.deviceClassName" -}}
{{- $plain := replace "/" "-" . -}}
{{- $name := regexReplaceAll "[^a-z0-9.-]" (lower $plain) "-" -}}
{{- $subdomain := "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" -}}
{{- if or (ne $name $plain) (gt (len $name) 253) (not (regexMatch $subdomain $name)) -}}
{{- $name = printf "%s-%s" (regexReplaceAll "[-.]+$" (trunc 244 $name) "") (trunc 8 (sha1sum .)) -}}
{{- end -}}
{{- if not (regexMatch $subdomain $name) -}}
{{- fail (printf "%q: no DeviceClass name can be made of this resource name" .) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{/* The GPU DRA driver's classes as JSON [{resource, expression, config}], as
kubedevice.nvidia.dra.classes makes them: (dict "doc" config "driver" name "profiles" list). */}}
{{- define "kubedevice.gpuDeviceClasses" -}}
{{- $flags := .doc.flags | default dict -}}
{{- $strategy := toString ($flags.migStrategy | default "none") -}}
{{- $slicing := (.doc.sharing | default dict).timeSlicing | default dict -}}
{{- $shared := $slicing.resources | default list -}}
{{- $d := toJson .driver -}}
{{- $attr := printf "device.attributes[%s]" $d -}}
{{- $bases := list "nvidia.com/gpu" -}}
{{- if eq $strategy "mixed" -}}
{{- range .profiles }}{{- $bases = append $bases (printf "nvidia.com/mig-%s" .) -}}{{- end -}}
{{- end -}}
{{- $out := list -}}
{{- range $base := uniq $bases -}}
{{- $name := $base -}}
{{- $config := dict -}}
{{- range $shared -}}
{{- if eq (toString .name) $base -}}
{{- if .rename -}}{{- $name = .rename -}}{{- else if $slicing.renameByDefault -}}{{- $name = printf "%s.shared" $base -}}{{- end -}}
{{- $config = dict "apiVersion" "resource.kubedevice.io/v1" "kind" "GpuConfig" "sharing" (dict "strategy" "TimeSlicing") -}}
{{- end -}}
{{- end -}}
{{- $expr := printf "device.driver == %s" $d -}}
{{- $mig := false -}}
{{- if eq $base "nvidia.com/gpu" -}}
{{- if ne $strategy "single" -}}{{- $expr = printf "%s && %s.type == \"gpu\"" $expr $attr -}}{{- end -}}
{{- $mig = and (eq $strategy "single") (gt (len $.profiles) 0) -}}
{{- else -}}
{{- $expr = printf "%s && %s.type == \"mig\" && %s.profile == %s" $expr $attr $attr (toJson (trimPrefix "nvidia.com/mig-" $base)) -}}
{{- $mig = true -}}
{{- end -}}
{{- if and $config $mig -}}{{- $_ := set $config "kind" "MigDeviceConfig" -}}{{- end -}}
{{- $out = append $out (dict "resource" $name "expression" $expr "config" $config) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The /dev DRA driver's classes as JSON [{resource, expression}], as
kubedevice.generic.dra.classes makes them: (dict "doc" config "driver" name). */}}
{{- define "kubedevice.devDeviceClasses" -}}
{{- $d := toJson .driver -}}
{{- $out := list -}}
{{- range .doc.resources | default list -}}
{{- $expr := printf "device.driver == %s && device.attributes[%s].resource == %s" $d $d (toJson (trunc 64 (toString .name))) -}}
{{- $out = append $out (dict "resource" (toString .name) "expression" $expr) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* Refuses to render the GPU plugin and the GPU DRA driver on the same nodes: nothing tells
DRA which GPUs the plugin handed out, so a ResourceClaim could get them again. The values
split the nodes when the driver's affinity (dra.nvidia.affinity, empty: nvidia.affinity) or
nodeSelector differs from the plugin's. Takes the root context. */}}
{{- define "kubedevice.gpuNodesApart" -}}
{{- $v := .Values -}}
{{- if and $v.nvidia.enabled $v.dra.nvidia.enabled -}}
{{- $affinity := $v.dra.nvidia.affinity | default $v.nvidia.affinity -}}
{{- if and (eq (toJson $affinity) (toJson $v.nvidia.affinity)) (eq (toJson $v.dra.nvidia.nodeSelector) (toJson $v.nvidia.nodeSelector)) -}}
{{- fail "nvidia.enabled and dra.nvidia.enabled put the GPU plugin and the GPU DRA driver on the same nodes, where a ResourceClaim can get a GPU the plugin handed out: give dra.nvidia.affinity (or dra.nvidia.nodeSelector) other nodes than nvidia.affinity (nvidia.nodeSelector), or turn one of them off (docs/deploy.md, section 3)" -}}
{{- end -}}
{{- end -}}
{{- end -}}
