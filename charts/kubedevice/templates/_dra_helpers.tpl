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

{{/* The env every DRA driver gets: its node's name from the downward API, and logging. */}}
{{- define "kubedevice.draEnv" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
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
{{- end -}}
