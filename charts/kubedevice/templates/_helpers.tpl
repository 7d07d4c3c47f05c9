{{/* Chart name, or nameOverride. */}}
{{- define "kubedevice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Base name of every object: fullnameOverride, else the release name (plus the chart
name when the release name does not contain it). Components append at most
"-nvidia-metrics" (15 characters), so the base is cut at 48: every name stays a DNS label. */}}
{{- define "kubedevice.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 48 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 48 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 48 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of a component's objects: (dict "root" $ "component" "generic"|"nvidia") */}}
{{- define "kubedevice.componentName" -}}
{{- $base := include "kubedevice.fullname" .root -}}
{{- if eq .component "generic" -}}{{ $base }}{{- else -}}{{ printf "%s-%s" $base .component }}{{- end -}}
{{- end -}}

{{- define "kubedevice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubedevice.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "kubedevice.labels" -}}
{{ include "kubedevice.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: kubedevice
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "kubedevice.image" -}}
{{- $img := .Values.image -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{/* A component's config file text: values hold the file's text (a string, used as it
is: the default, or --set-file) or YAML (a map, from a values file). */}}
{{- define "kubedevice.configText" -}}
{{- if kindIs "string" . -}}{{ . }}{{- else -}}{{ toYaml . }}{{- end -}}
{{- end -}}

{{/* What the GPU plugin's config asks of its pod, as JSON: {"mig": bool, "cdi": bool}.
mig: migStrategy is not none; cdi: a cdi-* deviceListStrategy. From nvidia.config (text or
map); with an existingConfigMap the chart cannot know, so both are true (as NVIDIA's chart
assumes for a ConfigMap). Root context. */}}
{{- define "kubedevice.gpuNeeds" -}}
{{- $c := .Values.nvidia -}}
{{- if $c.existingConfigMap -}}
{{- /* not readable here: MIG and CDI assumed; MPS (host PID) never assumed */}}
{{- dict "mig" true "cdi" true "mps" false "mpsRoot" "/run/nvidia/mps" | toJson -}}
{{- else -}}
{{- $doc := $c.config -}}
{{- if kindIs "string" $doc -}}{{- $doc = fromYaml $doc -}}{{- end -}}
{{- $flags := dict -}}
{{- if kindIs "map" $doc -}}{{- $flags = $doc.flags | default dict -}}{{- end -}}
{{- if not (kindIs "map" $flags) -}}{{- $flags = dict -}}{{- end -}}
{{- $mig := ne (toString ($flags.migStrategy | default "none")) "none" -}}
{{- $strategies := $flags.deviceListStrategy | default "envvar" -}}
{{- if not (kindIs "slice" $strategies) -}}{{- $strategies = list $strategies -}}{{- end -}}
{{- $cdi := false -}}
{{- range $strategies -}}{{- if hasPrefix "cdi-" (toString .) -}}{{- $cdi = true -}}{{- end -}}{{- end -}}
{{- /* sharing.mps with resources: the plugin runs MPS control daemons (under flags.mpsRoot) */}}
{{- $sharing := dict -}}
{{- if kindIs "map" $doc -}}{{- $sharing = $doc.sharing | default dict -}}{{- end -}}
{{- if not (kindIs "map" $sharing) -}}{{- $sharing = dict -}}{{- end -}}
{{- $mpsConf := $sharing.mps | default dict -}}
{{- if not (kindIs "map" $mpsConf) -}}{{- $mpsConf = dict -}}{{- end -}}
{{- $mps := gt (len ($mpsConf.resources | default list)) 0 -}}
{{- $mpsRoot := toString ($flags.mpsRoot | default "/run/nvidia/mps") -}}
{{- dict "mig" $mig "cdi" $cdi "mps" $mps "mpsRoot" $mpsRoot | toJson -}}
{{- end -}}
{{- end -}}

{{/* The DaemonSet's metadata and selector, and its pod template's labels:
(dict "root" $ "component" "generic"|"nvidia"). */}}
{{- define "kubedevice.daemonSetMeta" -}}
metadata:
  name: {{ include "kubedevice.componentName" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "kubedevice.labels" . | nindent 4 }}
spec:
  selector:
    matchLabels:
      {{- include "kubedevice.selectorLabels" . | nindent 6 }}
  {{- $strategy := .root.Values.updateStrategy }}
  updateStrategy:
    type: {{ $strategy.type }}
    {{- with $strategy.rollingUpdate }}
    rollingUpdate:
      {{- toYaml . | nindent 6 }}
    {{- end }}
{{- end -}}

{{/* A component's pod labels (the selector's, the usual ones, podLabels): (dict "root" $
"component" ...). */}}
{{- define "kubedevice.podLabels" -}}
{{ include "kubedevice.labels" . }}
{{- with .root.Values.podLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Pod template fields both components share, with the component's scheduling:
(dict "root" $ "component" ...). */}}
{{- define "kubedevice.podCommon" -}}
{{- $v := .root.Values -}}
{{- $c := index $v .component -}}
automountServiceAccountToken: false
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
{{- include "kubedevice.scheduling" $c }}
{{- end -}}

{{/* A pod's nodeSelector, affinity and tolerations, from a map of values with those keys
(a component's, or a DRA driver's with its defaults filled in). */}}
{{- define "kubedevice.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The GPU pods' container security context: securityContext with the component's own
(.own) merged over it, plus SYS_ADMIN when MIG is on (.mig), which NVML needs to read the
MIG capability devices (as NVIDIA's chart), and DAC_OVERRIDE when MPS daemons get cgroups of
their own on the host (.cgroup): the root directory of a cgroup hierarchy is read-only
(0555) even to uid 0 without it, and their parent cgroup is made there.
(dict "root" $ "own" map "mig" bool "cgroup" bool) */}}
{{- define "kubedevice.gpuSecurityContext" -}}
{{- $sc := mergeOverwrite (deepCopy .root.Values.securityContext) (deepCopy (.own | default dict)) -}}
{{- $add := list -}}
{{- if .mig -}}{{- $add = append $add "SYS_ADMIN" -}}{{- end -}}
{{- if .cgroup -}}{{- $add = append $add "DAC_OVERRIDE" -}}{{- end -}}
{{- if $add -}}
{{- $caps := deepCopy ($sc.capabilities | default dict) -}}
{{- $_ := set $caps "add" (concat ($caps.add | default list) $add | uniq) -}}
{{- $_ := set $sc "capabilities" $caps -}}
{{- end -}}
{{- toYaml $sc -}}
{{- end -}}

{{/* Container fields both components share (image, command, metrics port, resources):
(dict "root" $ "component" ...). The args, env and mounts stay in each DaemonSet. */}}
{{- define "kubedevice.containerCommon" -}}
{{- $c := index .root.Values .component -}}
image: {{ include "kubedevice.image" .root | quote }}
imagePullPolicy: {{ .root.Values.image.pullPolicy }}
# dumb-init (pid 1) forwards signals and reaps health-check children.
command: ["dumb-init", "--", "kubedevice"]
{{- if $c.metrics.enabled }}
ports:
  - name: metrics
    containerPort: {{ $c.metrics.port }}
    protocol: TCP
{{- end }}
resources:
  {{- toYaml $c.resources | nindent 2 }}
{{- end -}}

{{/* The logging environment both components get (root context). */}}
{{- define "kubedevice.logEnv" -}}
- name: KUBEDEVICE_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
- name: KUBEDEVICE_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
{{- end -}}

{{/* Mounts both components have: the kubelet's plugin dir, the host's /dev and /sys. */}}
{{- define "kubedevice.hostMounts" -}}
- name: device-plugins
  mountPath: /var/lib/kubelet/device-plugins
- name: host-dev
  mountPath: /host/dev
  readOnly: true
  mountPropagation: HostToContainer
- name: host-sys
  mountPath: /host/sys
  readOnly: true
{{- end -}}

{{/* The volumes behind "kubedevice.hostMounts", and the component's config volume:
(dict "root" $ "component" ...). */}}
{{- define "kubedevice.commonVolumes" -}}
{{- $c := index .root.Values .component -}}
- name: device-plugins
  hostPath:
    path: {{ .root.Values.devicePluginDir | quote }}
    type: Directory
- name: host-dev
  hostPath:
    path: "/dev"
    type: Directory
- name: host-sys
  hostPath:
    path: "/sys"
    type: Directory
- name: config
  configMap:
    name: {{ $c.existingConfigMap | default (printf "%s-config" (include "kubedevice.componentName" .)) }}
    items:
      - key: config.yaml
        path: config.yaml
{{- end -}}

{{/* NOTES.txt: what a GPU component's runtimeClassName (.name, set with .key) means for
its pods; .what names the component ("plugin", "driver"). */}}
{{- define "kubedevice.runtimeClassNote" -}}
{{- if .name }}
    runtimeClassName {{ .name }}: the RuntimeClass must exist
    (kubectl get runtimeclass {{ .name }}), else its pods are never created.
{{- else }}
    No runtimeClassName: the pods use each node's default runtime, which must be the NVIDIA
    container runtime (nvidia-ctk runtime configure --set-as-default), else NVML finds no
    GPU and the {{ .what }} exits. Where a RuntimeClass for the NVIDIA runtime exists and it is
    not the default (the GPU operator creates "nvidia"), set --set {{ .key }}=nvidia.
{{- end }}
{{- end -}}
